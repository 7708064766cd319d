from spillway.cli import main

main(prog_name="spillway")

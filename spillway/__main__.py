from .service.cli import main

main(prog_name="spillway")

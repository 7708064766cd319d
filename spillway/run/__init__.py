"""Running one registered workflow on a cluster and reporting what it did.

validate (a size the cluster cannot hold is refused first, in bytes) -> build (lazy) ->
project the footprint and admit -> compute with progress -> verify -> report, in modules
named for what they hold: :mod:`.target` (what the workers offer), :mod:`.compute` (the
run and its report), :mod:`.host` (results brought to the host), :mod:`.output` (an array
output written and read back), :mod:`.verify`, :mod:`.stats` (transfers, spills and peaks
from the workers' snapshots), :mod:`.text` and :mod:`.report` (the report for a terminal
and a notebook); :mod:`.measuring`: what each worker did, read with ``client.run`` (the
bench's and a notebook's way to measure a cluster).

This layer sits on the workflows and the rooms below them, and below the notebook
clusters (:mod:`spillway.clusters`) and the shared service; the
package imports nothing itself, so a client that only shows a report loads no workflow.
"""

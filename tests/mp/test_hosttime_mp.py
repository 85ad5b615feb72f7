"""The allreduce-latency measurement of hetsync.bench.hosttime under a real 2-rank horovodrun launch."""
import json

from conftest import launch


def test_the_allreduce_latency_is_measured_on_every_rank():
    proc = launch(2, ["-m", "hetsync.bench.hosttime", "allreduce", "--calls", "5", "--idle-ms", "2"],
                  launcher="horovodrun-mpi", timeout=240)
    # horovodrun prefixes each rank's output ("[1,0]<stdout>:"); the document is the JSON object in that line
    lines = [line[line.index("{"):] for line in proc.stdout.splitlines() if '"median_ms_per_rank"' in line]
    assert len(lines) == 1, proc.stdout[-3000:]
    doc, _ = json.JSONDecoder().raw_decode(lines[0])
    assert doc["np"] == 2 and doc["bytes"] == 407080 and doc["idle_ms"] == 2.0 and doc["calls"] == 5
    assert len(doc["median_ms_per_rank"]) == 2 and all(0 < ms < 10_000 for ms in doc["median_ms_per_rank"])

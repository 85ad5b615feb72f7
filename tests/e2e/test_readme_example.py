"""The README's example, as a user copies it: extracted from README.md and run on 2 ranks with horovodrun."""
import os
import re

from conftest import ROOT, launch


def test_the_readme_example_trains_on_two_ranks(tmp_path):
    with open(os.path.join(ROOT, "README.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    assert len(blocks) == 1, "the README has one Python example"
    script = tmp_path / "example.py"
    script.write_text(blocks[0])
    proc = launch(2, [str(script)], launcher="horovodrun-mpi", timeout=300)
    # each rank prints its model's accuracy on the digits it trained on: 10 epochs of RNA reach well above 0.85
    found = dict(re.findall(r"rank (\d): accuracy ([\d.]+)", proc.stdout))
    assert sorted(found) == ["0", "1"], proc.stdout[-2000:]
    assert all(float(a) > 0.85 for a in found.values()), found

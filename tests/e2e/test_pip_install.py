"""The documented ``pip install`` route: from a copy of the checkout into a fresh environment that already has
TensorFlow, horovod and mpi4py (here: the suite's own stack, put on the new environment's path), the op
library is compiled against that TensorFlow, and the README's example trains on 2 ranks with the installed
package (not the checkout's)."""
import os
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest

from conftest import ROOT, run_job


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_pip_install_from_a_clone_builds_the_op_library_and_runs_the_readme_example(tmp_path):
    # the checkout as a clone would have it: tracked and untracked files that git does not ignore
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                            check=True, timeout=60).stdout.decode().split("\0")
    clone = tmp_path / "clone"
    for rel in filter(None, listed):
        src = os.path.join(ROOT, rel)
        if os.path.isfile(src):
            os.makedirs(clone / os.path.dirname(rel), exist_ok=True)
            shutil.copy2(src, clone / rel)
    assert not list(clone.glob("hetsync/_hetsync_ops*.so"))
    env_dir = tmp_path / "env"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(env_dir)], check=True, timeout=300)
    # an environment that "has TensorFlow, horovod and mpi4py": the suite's site-packages on its path (a path
    # entry, not a site directory, so the suite's editable hetsync is not visible there)
    stack = sysconfig.get_paths()["purelib"]
    new_site = subprocess.run([str(env_dir / "bin" / "python"), "-c", "import sysconfig; "
                               "print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True,
                              check=True, timeout=60).stdout.strip()
    with open(os.path.join(new_site, "zz_stack.pth"), "w") as f:
        f.write(stack + "\n")
    py = str(env_dir / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([py, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", str(clone)],
                          capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check = subprocess.run([py, "-c", "import hetsync, hetsync.ops.library as lib; lib.load_library(); "
                            "print(hetsync.__file__); print(lib.build_info())"],
                           capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert check.returncode == 0, check.stderr[-3000:]
    assert check.stdout.splitlines()[0].startswith(new_site), check.stdout
    with open(os.path.join(ROOT, "README.md")) as f:
        (example,) = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    script = tmp_path / "example.py"
    script.write_text(example)
    from hetsync.bench import launch as jobs

    cmd = jobs.mpirun(2, [str(script)])
    cmd[cmd.index(sys.executable)] = py  # the new environment's interpreter on every rank
    run = run_job(cmd, 600, env={"PYTHONPATH": None})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

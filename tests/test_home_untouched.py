"""batchsim writes nothing outside its own files: drawing plots leaves the home folder alone.

matplotlib creates its configuration folder and a font list under ``$HOME`` on first import;
batchsim points it at its own folder first (``sim.report.mpl_home``). Each check runs in a
fresh interpreter with an empty home, because matplotlib chooses its folders once a process.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DRAW = """
import sys
from pathlib import Path
from matplotlib.figure import Figure  # noqa: E402  (after sim.report: the folder is chosen)
fig = Figure()
fig.add_subplot().plot([0, 1], [1, 0], label="a")
fig.legend()
fig.savefig(Path(sys.argv[1]) / "p.png")
import matplotlib
print(matplotlib.get_configdir())
"""


def _draw(tmp_path: Path, prelude: str, **env: str) -> tuple[Path, str]:
    """Draw one figure in a new interpreter whose home is an empty folder; return the home
    and the configuration folder matplotlib used."""
    home = tmp_path / "home"
    home.mkdir()
    clean = {k: v for k, v in os.environ.items()
             if k not in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME")}
    out = subprocess.run([sys.executable, "-c", prelude + DRAW, str(tmp_path)], check=True,
                         capture_output=True, text=True,
                         env={**clean, "HOME": str(home), **env})
    return home, out.stdout.strip().splitlines()[-1]


def test_drawing_a_report_plot_writes_nothing_in_the_home_folder(tmp_path: Path) -> None:
    home, used = _draw(tmp_path, "import sim.report\n")
    assert list(home.rglob("*")) == []
    assert (tmp_path / "p.png").stat().st_size > 0
    assert Path(used) == Path(sys.modules["sim"].__file__).parent / ".matplotlib"


def test_a_folder_the_user_chose_is_kept(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    home, used = _draw(tmp_path, "import sim.report\n", MPLCONFIGDIR=str(mine))
    assert Path(used) == mine
    assert list(home.rglob("*")) == []


def test_a_package_that_cannot_be_written_to_uses_a_temporary_folder(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # a folder cannot be made under a file
    prelude = ("from pathlib import Path\nimport sim.report.mpl_home as m\n"
               f"m.PACKAGE_FOLDER = Path({str(blocked / 'x')!r})\n"
               "import os; os.environ.pop('MPLCONFIGDIR', None)\nm.use_own_folder()\n")
    home, used = _draw(tmp_path, prelude)
    assert list(home.rglob("*")) == []
    assert Path(used).name.startswith("batchsim-matplotlib-")
    assert not Path(used).exists()  # removed when the process ended


def test_a_run_with_its_plots_and_report_writes_nothing_in_the_home_folder(tmp_path: Path
                                                                          ) -> None:
    home = tmp_path / "home"
    home.mkdir()
    clean = {k: v for k, v in os.environ.items()
             if k not in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME")}
    repo = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-m", "sim.cli.main", "run",
                    str(repo / "experiments" / "quickstart.yaml"), "--set",
                    "workload.max_requests=60", "--sweep", "workload.rate=[4]",
                    "--out", str(tmp_path / "out")],
                   check=True, capture_output=True, text=True, env={**clean, "HOME": str(home)})
    assert list((tmp_path / "out" / "plots").glob("*.png"))
    assert list(home.rglob("*")) == []

"""The perseus package's side of the launcher-library contract: perseus/_contract.py against
lib/rendezvous/job_contract.h (the names perseusrun and libperseus use), and where the package
looks for libperseus against where an installation and a build tree put it. Needs no torch.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIMS = REPO / "lib/framework_shims"
HEADER = REPO / "lib/rendezvous/job_contract.h"

sys.path.insert(0, str(SHIMS))
from perseus import _contract  # noqa: E402

# perseus/_contract.py's name -> job_contract.h's
MIRRORED = {
    "RENDEZVOUS_ADDR": "kRendezvousAddr",
    "LIBRARY": "kLibrary",
    "PACKAGED_LIBRARY": "kPackagedLibrary",
    "BUILD_TREE_LIBRARY": "kBuildTreeLibrary",
    "ELASTIC_WORKER": "kElasticWorker",
}


def header_constants():
    text = HEADER.read_text()
    found = dict(re.findall(r'inline constexpr char (k\w+)\[\] = "([^"]*)";', text))
    assert len(found) >= 15, "job_contract.h's constants not found: %s" % found
    return found


def test_the_python_copy_equals_the_header():
    header = header_constants()
    for python_name, header_name in MIRRORED.items():
        assert getattr(_contract, python_name) == header[header_name], python_name
    public = {n for n in vars(_contract) if n.isupper()}
    assert public == set(MIRRORED), "perseus/_contract.py has names the test does not check"


def test_rendezvous_addr_is_a_launcher_variable():
    # _ddp.py takes it as "started by perseusrun": it must be one that only a launcher sets.
    text = HEADER.read_text()
    launcher = re.search(r"kLauncherVariables\[\] = \{([^}]*)\}", text).group(1)
    assert "kRendezvousAddr" in re.findall(r"k\w+", launcher)
    assert "kLibrary" not in launcher  # users export PERSEUS_LIBRARY themselves


def test_the_install_puts_the_library_where_the_package_looks():
    install = (REPO / "cmake/Install.cmake").read_text()
    rule = re.search(r'install\(FILES "\$<TARGET_FILE:perseus>" DESTINATION '
                     r'"\$\{perseus_package_dir\}/([^"]*)"\s+RENAME (\S+)', install)
    assert rule, "cmake/Install.cmake no longer installs libperseus into the package"
    assert "perseus/%s/%s" % rule.groups() == _contract.PACKAGED_LIBRARY


def candidates(package_parent, env_library=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERSEUS_")}
    env["PYTHONPATH"] = str(package_parent)
    if env_library:
        env["PERSEUS_LIBRARY"] = env_library
    code = "from perseus import _native; print('\\n'.join(_native._candidates()))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return out.split()


def test_an_installed_package_loads_its_own_library_first(tmp_path):
    site = tmp_path / "site-packages"
    shutil.copytree(SHIMS / "perseus", site / "perseus",
                    ignore=shutil.ignore_patterns("__pycache__"))
    library = site / _contract.PACKAGED_LIBRARY
    library.parent.mkdir(parents=True, exist_ok=True)
    library.write_bytes(b"")
    assert candidates(site)[0] == str(library)
    # PERSEUS_LIBRARY, as perseusrun or the user sets it, wins over everything.
    assert candidates(site, "/opt/other/libperseus.so") == ["/opt/other/libperseus.so"]


def test_the_source_tree_package_finds_the_build_trees_library():
    built = REPO / "build" / _contract.BUILD_TREE_LIBRARY
    if not built.exists():
        pytest.skip("no build tree at %s" % built)
    assert str(built) in candidates(SHIMS)

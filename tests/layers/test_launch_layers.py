"""lib/launch's folders are layers (docs/ARCHITECTURE.md, "lib/launch, layer by layer"): each
includes only from the layers its table row allows. Reads every #include of lib/launch."""
import re
from pathlib import Path

LAUNCH = Path(__file__).resolve().parents[2] / "lib/launch"
INCLUDE = re.compile(r'^#include "lib/launch/([^"]+)"', re.M)

# The folder of a file, "" for the base; the folders each may include from.
ALLOWED = {
    "": {""},
    "protocol": {"", "protocol"},
    "planning": {"", "protocol", "planning"},
    "agent": {"", "protocol", "agent"},
    "remote": {"", "protocol", "planning", "remote"},
    "launcher": {"", "protocol", "planning", "agent", "remote", "launcher"},
}
# The exceptions the table names.
EXCEPTIONS = {
    ("launch_config.h", "planning/gpu_allotment.h"),  # its option enums
    ("launch_config.h", "planning/placement.h"),
    ("remote/agent_factory.h", "agent/host_check.h"),  # the check request and report
}


def folder(relative):
    return relative.split("/")[0] if "/" in relative else ""


def test_every_folder_includes_only_from_the_layers_it_may():
    files = [p for p in LAUNCH.rglob("*") if p.suffix in (".h", ".cc")]
    assert len(files) > 60, "lib/launch's sources not found under %s" % LAUNCH
    assert {folder(str(p.relative_to(LAUNCH))) for p in files} == set(ALLOWED)
    wrong = []
    for path in files:
        me = str(path.relative_to(LAUNCH))
        for target in INCLUDE.findall(path.read_text()):
            if folder(target) not in ALLOWED[folder(me)] and (me, target) not in EXCEPTIONS:
                wrong.append("%s includes %s" % (me, target))
    assert not wrong, "\n".join(wrong)

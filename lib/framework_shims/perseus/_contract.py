"""What this package shares with perseusrun and libperseus, mirrored from
lib/rendezvous/job_contract.h (tests/shims/test_contract.py holds the two equal)."""

# A variable only a Perseus launcher sets for each rank it starts: the job's store.
RENDEZVOUS_ADDR = "PERSEUS_RENDEZVOUS_ADDR"
# Set for every process of an elastic job (perseusrun --host-discovery-script): its id.
ELASTIC_WORKER = "PERSEUS_ELASTIC_WORKER"
# The libperseus to load, set by the user or by perseusrun.
LIBRARY = "PERSEUS_LIBRARY"
# The package's own copy of libperseus, relative to the folder that holds the package (an
# installation, a wheel); libperseus in a build tree, relative to the build folder.
PACKAGED_LIBRARY = "perseus/lib/libperseus.so"
BUILD_TREE_LIBRARY = "lib/comm/libperseus.so"

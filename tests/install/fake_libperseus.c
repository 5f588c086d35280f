/* A libperseus of another C ABI: perseus_version() reports the major version in
   FAKE_VERSION_CODE (major * 10000 + minor * 100 + patch). The package must refuse it. */
int perseus_version(void) { return FAKE_VERSION_CODE; }

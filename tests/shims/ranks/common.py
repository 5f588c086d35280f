"""Shared by the rank scripts: a check counter and the job's place."""
import os
import sys
import traceback


class Checks:
    def __init__(self, label):
        self.label = label
        self.passed = 0
        self.failed = []

    def __call__(self, condition, what):
        if condition:
            self.passed += 1
        else:
            self.failed.append(what)
            print("FAILED: %s" % what, file=sys.stderr, flush=True)

    def close(self, v=None, ref=None, what="", rtol=1e-5, atol=1e-6):
        import torch
        ok = v.shape == ref.shape and v.dtype == ref.dtype and torch.allclose(
            v.double(), ref.double(), rtol=rtol, atol=atol)
        if not ok:
            what = "%s: got %s %s %s, expected %s %s %s" % (
                what, v.dtype, tuple(v.shape), v.flatten()[:6].tolist(), ref.dtype,
                tuple(ref.shape), ref.flatten()[:6].tolist())
        self(ok, what)

    def raises(self, exc, fn, what, contains=()):
        try:
            fn()
        except exc as e:
            text = str(e)
            missing = [c for c in contains if c not in text]
            self(not missing, "%s: %r lacks %s" % (what, text, missing))
            return e
        except Exception as e:  # noqa: BLE001
            self(False, "%s: raised %s: %s" % (what, type(e).__name__, e))
            return None
        self(False, "%s: raised nothing" % what)
        return None

    def finish(self):
        rank = os.environ.get("PERSEUS_RANK", "?")
        if self.failed:
            print("%s: rank %s: %d checks failed" % (self.label, rank, len(self.failed)),
                  flush=True)
            sys.exit(1)
        print("%s: %d checks passed" % (self.label, self.passed), flush=True)


def run(main):
    try:
        main()
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        sys.exit(2)

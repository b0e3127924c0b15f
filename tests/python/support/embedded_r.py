"""R embedded in the pytest process, with the multigpu R package and the R
scenario runner (`tests/testthat/helper-scenarios.R`) loaded, for the parity
check of `test_scenario_parity_keras3.py` (the keras3 R API: keras3 and
tfdatasets attached first, as R users have them)."""

import atexit
import gc
import json
import os
import pathlib
import sys

from support.scenario_files import ROOT, SCENARIO_DIR, recipes

R_HELPERS = [ROOT / "tests" / "testthat" / name
             for name in ("helper-scenarios.R", "helper-scenarios-keras3.R")]
# The R packages each API attaches before multigpu.
API_PACKAGES = {"plain": [], "keras3": ["keras3", "tfdatasets"]}


class EmbeddedR:
    """R embedded with rpy2, the multigpu R package and the R runner loaded.

    reticulate, loaded in the embedded R, attaches to this Python
    interpreter: R calls the same TensorFlow runtime, with the same 4
    logical devices, so both runs of a scenario start from the same state.

    rpy2 is used only to start R and load the runner. The scenarios are run
    by calling the R runner as a Python function (reticulate turns an R
    function into a Python callable): rpy2 releases the GIL while R runs,
    and reticulate 1.28's finalizers of Python objects, run by R's garbage
    collector, then crash the process; called through reticulate, R runs
    with the GIL held.
    """

    # Whether R was embedded in this process (conftest.py then ends the
    # process without Python's finalization).
    started = False

    def __init__(self, api="plain"):
        self.api = api
        EmbeddedR.started = True
        os.environ.setdefault("RETICULATE_PYTHON", sys.executable)
        import rpy2.rinterface
        import rpy2.robjects as robjects
        # rpy2 ends R at exit, after reticulate released this interpreter's
        # thread state: Python then aborts ("GIL is released").
        atexit.unregister(rpy2.rinterface.endr)
        attach = "".join(f"  library({package})\n"
                         for package in API_PACKAGES[api])
        robjects.r(R_SETUP.format(attach=attach, root=_r_string(ROOT),
                                  helpers=", ".join(map(_r_string, R_HELPERS)),
                                  scenarios=_r_string(SCENARIO_DIR)))
        self.runner = recipes.R_RUNNER

    def close(self):
        self.runner = recipes.R_RUNNER = None
        gc.collect()
        # reticulate lets R process its events from Python's pending calls,
        # also while Python shuts down, when rpy2's event callback is gone.
        from rpy2.rinterface_lib import openrlib
        openrlib.rlib.ptr_R_ProcessEvents = openrlib.ffi.NULL

    def run(self, scenario_path, workdir):
        name = pathlib.Path(scenario_path).stem
        recipes.R_RECORDS.pop(name, None)
        self.runner(str(scenario_path), str(workdir), self.api)
        return recipes.R_RECORDS.pop(name)


R_SETUP = """
suppressPackageStartupMessages({{
  library(testthat)
{attach}  if (requireNamespace("pkgload", quietly = TRUE) &&
      file.exists(file.path({root}, "NAMESPACE"))) {{
    pkgload::load_all({root}, export_all = FALSE, helpers = FALSE,
                      attach_testthat = FALSE, quiet = TRUE)
  }} else {{
    library(multigpu)
  }}
}})
for (helper in c({helpers})) sys.source(helper, envir = globalenv())
reticulate::py_set_attr(scenario_recipes({scenarios}), "R_RUNNER",
                        run_scenario_for_python)
"""


def _r_string(path):
    return json.dumps(str(path))

# testthat runs the test files in parallel R processes
# (Config/testthat/parallel in DESCRIPTION; TESTTHAT_CPUS of them, 2 by
# default), and each runs this file first. TensorFlow fixes its devices when
# it starts, so the simulated devices are configured here, once per process,
# before any test touches TensorFlow: 4 logical CPU devices, as in the Python
# tests.
if (is_multigpu_available()) {
  virtual_devices(4)
  keras_py()$utils$set_random_seed(1L)
  # Without a GPU the core warns once per session that replicas run on CPU
  # devices; take that one warning here so that tests see a quiet core
  # (test-multi-gpu-model.R checks the warning in a fresh R session).
  withCallingHandlers(
    multi_gpu_model(tiny_model(), gpus = 2),
    multigpu_warning = function(w) {
      if (grepl("No GPU found", conditionMessage(w))) {
        invokeRestart("muffleWarning")
      }
    }
  )
}

# A chain of dense layers: 4 inputs, 8 + 8 hidden units, 3 outputs.
chain_of_dense <- function() {
  keras <- keras_py()
  keras$Sequential(list(
    keras$Input(shape = list(4L)),
    keras$layers$Dense(8L, activation = "relu", name = "encode"),
    keras$layers$Dense(8L, activation = "relu", name = "transform"),
    keras$layers$Dense(3L, name = "score")
  ), name = "chain")
}

test_that("placement_report() returns a data frame of devices and prints a table", {
  skip_if_no_multigpu()
  partitioned <- model_parallel(chain_of_dense(), devices = 2, split = "transform")
  compile(partitioned, loss = "sparse_categorical_crossentropy", optimizer = "adam")
  before <- partitioned$template$get_weights()
  expect_output(
    report <- placement_report(partitioned, iris_x(1:16), iris_y(1:16)),
    "device +variables +variable bytes +ops +time share"
  )
  expect_s3_class(report, "data.frame")
  expect_named(report, c("device", "variables", "variable_bytes", "ops", "time_share",
                         "sent_bytes", "received_bytes"))
  expect_identical(report$device, sprintf("/device:CPU:%d", 0:3))
  expect_identical(report$variables, c(2L, 4L, 0L, 0L))
  expect_identical(report$variable_bytes, c(4 * (4 * 8 + 8), 4 * (8 * 8 + 8 + 8 * 3 + 3), 0, 0))
  expect_true(all(report$ops[1:2] > 0))
  expect_identical(report$ops[3:4], c(0L, 0L))
  expect_equal(sum(report$time_share), 1, tolerance = 1e-6)
  expect_match(attr(report, "notes"), "2 of 4 devices ran ops", all = FALSE)
  expect_equal(partitioned$template$get_weights(), before)

  # 16 rows of the 8 hidden units (float32) cross to stage 2 and their
  # gradient comes back (the NaN guard's verdict reaches stage 2 as a
  # control edge, no data).
  transfers <- attr(report, "transfers")
  expect_named(transfers, c("from", "to", "weights", "activations",
                            "activation_gradients", "gradients", "all_reduce", "total"))
  forward <- transfers[transfers$from == "/device:CPU:0" & transfers$to == "/device:CPU:1", ]
  backward <- transfers[transfers$from == "/device:CPU:1" & transfers$to == "/device:CPU:0", ]
  expect_identical(forward$activations, 16 * 8 * 4)
  expect_identical(backward$activation_gradients, 16 * 8 * 4)
  expect_identical(report$sent_bytes[3:4], c(0, 0))
  expect_identical(sum(report$sent_bytes), sum(transfers$total))
  gradients <- 4 * (4 * 8 + 8) + 4 * (8 * 8 + 8 + 8 * 3 + 3)
  expect_identical(attr(report, "gradient_bytes"), gradients)
  expect_equal(attr(report, "ring_bound_bytes"), gradients)  # 2 (n - 1) / n, n = 2

  weights_only <- placement_report(partitioned, print_table = FALSE)
  expect_true(all(is.na(weights_only$ops)) && all(is.na(weights_only$time_share)))
  expect_true(all(is.na(weights_only$sent_bytes)))
  expect_null(attr(weights_only, "transfers"))
  expect_error(placement_report(chain_of_dense(), iris_x(1:4), iris_y(1:4), print_table = FALSE),
               "not compiled", class = "multigpu_value_error")
  expect_error(placement_report(partitioned, print_table = NA), "`print_table` must be TRUE or FALSE")
})

test_that("plot() draws one group of bars per device with the report's numbers", {
  skip_if_no_multigpu()
  partitioned <- model_parallel(chain_of_dense(), devices = 2, split = "transform")
  compile(partitioned, loss = "sparse_categorical_crossentropy", optimizer = "sgd")
  report <- placement_report(partitioned, iris_x(1:16), iris_y(1:16), print_table = FALSE)
  expect_s3_class(report, c("multigpu_placement_report", "data.frame"))
  pdf(NULL)
  on.exit(grDevices::dev.off(), add = TRUE)
  bars <- plot(report)
  metrics <- c("weights", "ops", "time", "transfers")
  expect_identical(bars$device, rep(report$device, each = 4))
  expect_identical(bars$metric, rep(metrics, times = 4))
  value <- function(metric) bars$value[bars$metric == metric]
  share <- function(metric) bars$share[bars$metric == metric]
  expect_identical(value("weights"), report$variable_bytes)
  expect_identical(value("ops"), as.double(report$ops))
  expect_identical(value("time"), report$time_share)
  expect_identical(value("transfers"), report$sent_bytes + report$received_bytes)
  for (metric in metrics) {
    expect_equal(share(metric), value(metric) / sum(value(metric)))
  }
  expect_identical(share("ops")[3:4], c(0, 0))   # two stages: two idle devices
  expect_identical(bars$label[1], "160 B")      # 4 * (4 * 8 + 8) bytes on CPU:0

  weights_only <- plot(placement_report(partitioned, print_table = FALSE))
  expect_identical(unique(weights_only$metric), "weights")
  expect_error(plot(structure(data.frame(device = "/device:CPU:0"),
                              class = c("multigpu_placement_report", "data.frame"))),
               "lacks the column", class = "multigpu_type_error")
})

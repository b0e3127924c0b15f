#' Where a model's weights live and where its work runs
#'
#' Answers "am I using all my GPUs?" in one call, from what TensorFlow did
#' rather than what was asked for, for any model: one returned by
#' [multi_gpu_model()] or [model_parallel()], one built under
#' [mirrored_strategy()] (a mirrored weight counts once on every device that
#' holds a copy), or a plain Keras model.
#'
#' Weights are read from where the variables live. With `x`, one step runs
#' on that batch, a prediction step, or a training step when `y` is given
#' (the model must be compiled); the ops each device executed are read from
#' the graphs TensorFlow ran, and the time share from the TensorFlow
#' profiler's trace. The bytes that crossed from one device to another are
#' read from the transfers in those graphs (`_Send`/`_Recv` pairs and
#' collective all-reduces), sized by TensorFlow's debugger: on GPUs each is
#' a copy over the link, between logical CPU devices TensorFlow passes a
#' reference instead. The weights, optimizer and metrics are restored
#' afterwards: the report does not train the model.
#'
#' @param model A Keras model.
#' @param x `NULL` for weights only, or the inputs of one batch.
#' @param y `NULL` for a prediction step, or the targets of that batch for
#'   a training step.
#' @param print_table `TRUE` to print the report as a table, with notes on
#'   what was measured.
#' @returns A data frame with one row per device of the machine (idle ones
#'   included): `device`, `variables` (count), `variable_bytes`, `ops` (ops
#'   executed in the step, without transfers and function boundaries; `NA`
#'   without `x`) and `time_share` (share of the step's kernel time; `NA`
#'   when unknown), `sent_bytes` and `received_bytes` (bytes the device sent
#'   to and received from other devices in the step; `NA` without `x`).
#'   Attributes: `transfers`, a data frame of the bytes per pair of devices
#'   (`from`, `to`) and kind (`weights`, `activations`,
#'   `activation_gradients`, `gradients`, `all_reduce`, `total`);
#'   `gradient_bytes` (one copy of the trainable weights);
#'   `ring_bound_bytes`, what each of the devices that ran ops would send in
#'   a ring all-reduce of those gradients, `2 (n - 1) / n` times them; and
#'   `notes`, which explain the columns. Of class
#'   `multigpu_placement_report` (a data frame), whose [plot()][plot.multigpu_placement_report]
#'   method draws it; returned invisibly when printed.
#' @family multi-device training
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' model <- keras_model_sequential(input_shape = 4) |>
#'   layer_dense(8) |>
#'   layer_dense(1)
#' parallel_model <- model |> multi_gpu_model(gpus = 2)
#' x <- matrix(runif(64), ncol = 4)
#' report <- placement_report(parallel_model, x)
#' report[report$ops == 0, "device"]   # idle devices
#' parallel_model |> compile(loss = loss_mean_squared_error(), optimizer = optimizer_sgd())
#' report <- placement_report(parallel_model, x, rowSums(x), print_table = FALSE)
#' attr(report, "transfers")           # bytes per pair of devices and kind
#' attr(report, "ring_bound_bytes")    # the all-reduce bound per device
#' plot(report)                        # one group of bars per device
placement_report <- function(model, x = NULL, y = NULL, print_table = TRUE) {
  check_model(model)
  print_table <- as_flag(print_table)
  dtype <- input_dtype(model)
  report <- call_core("placement_report", model,
                      x = as_model_data(x, dtype), y = as_model_data(y, dtype),
                      print_table = FALSE)
  rows <- reticulate::import_builtins()$list(report)
  number <- function(key, as) {
    vapply(rows, function(row) {
      value <- row[[key]]
      if (is.null(value)) as(NA) else as(value)
    }, as(0))
  }
  frame <- data.frame(
    device = vapply(rows, function(row) row[["device"]], ""),
    variables = number("variables", as.integer),
    variable_bytes = number("variable_bytes", as.double),
    ops = number("ops", as.integer),
    time_share = number("time_share", as.double),
    sent_bytes = number("sent_bytes", as.double),
    received_bytes = number("received_bytes", as.double),
    stringsAsFactors = FALSE
  )
  attr(frame, "transfers") <- transfer_frame(report)
  attr(frame, "gradient_bytes") <- as.double(report$gradient_bytes)
  attr(frame, "ring_bound_bytes") <- as.double(report$ring_bound_bytes)
  attr(frame, "notes") <- unlist(report$notes)
  class(frame) <- c("multigpu_placement_report", class(frame))
  if (isTRUE(print_table)) {
    cat(report$table(), "\n", sep = "")
    return(invisible(frame))
  }
  frame
}

#' The bytes per pair of devices and kind of a report, as a data frame
#' (`NULL` when no step ran).
#' @noRd
transfer_frame <- function(report) {
  if (is.null(report$transfers)) return(NULL)
  pairs <- reticulate::import_builtins()$list(report$transfer_rows())
  kinds <- c(weights = "weights", activations = "activations",
             activation_gradients = "activation gradients",
             gradients = "gradients", all_reduce = "all-reduce",
             total = "total")
  columns <- lapply(kinds, function(kind) {
    vapply(pairs, function(pair) as.double(pair[[kind]]), 0)
  })
  data.frame(
    from = vapply(pairs, function(pair) pair[["source"]], ""),
    to = vapply(pairs, function(pair) pair[["destination"]], ""),
    columns,
    stringsAsFactors = FALSE
  )
}

#' Plot a placement report: one group of bars per device
#'
#' Draws what [placement_report()] measured, with base graphics: for each
#' device, its share of the model's weight bytes, of the ops of the observed
#' step, of the step's kernel time and of the bytes moved between devices
#' (sent plus received), each bar labelled with the device's own value. A
#' device doing its part has bars near `1 / devices`; an idle device has
#' none. Metrics the report has no value for (no batch: ops, time and
#' transfers) are left out. The numbers are the Python core's
#' (`multigpu.plot_placement` draws the same bars).
#'
#' @param x What [placement_report()] returned.
#' @param y Unused.
#' @param ... Further graphical parameters for [graphics::barplot()].
#' @returns A data frame of the bars drawn, invisibly: one row per device
#'   and metric, `device`, `metric` (`"weights"`, `"ops"`, `"time"`,
#'   `"transfers"`), `value` (the report's value; sent plus received bytes
#'   for transfers), `share` (the bar's height) and `label`.
#' @family multi-device training
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' model <- keras_model_sequential(input_shape = 4) |>
#'   layer_dense(8) |>
#'   layer_dense(1)
#' parallel_model <- model |> multi_gpu_model(gpus = 2)
#' parallel_model |> compile(loss = loss_mean_squared_error(), optimizer = optimizer_sgd())
#' x <- matrix(runif(64), ncol = 4)
#' report <- placement_report(parallel_model, x, rowSums(x), print_table = FALSE)
#' plot(report)
plot.multigpu_placement_report <- function(x, y, ...) {
  columns <- c("device", "variable_bytes", "ops", "time_share", "sent_bytes",
               "received_bytes")
  missing <- setdiff(columns, names(x))
  if (length(missing)) {
    multigpu_abort(sprintf(
      "`x` lacks the column(s) %s of a placement report; pass what placement_report() returned.",
      paste(missing, collapse = ", ")
    ), class = "multigpu_type_error")
  }
  rows <- lapply(seq_len(nrow(x)), function(i) {
    lapply(as.list(x[i, columns, drop = FALSE]),
           function(value) if (is.na(value)) NULL else value)
  })
  core()
  plotting <- reticulate::import("multigpu.insight.plotting")
  bars <- with_python(plotting$placement_bars(rows))
  metrics <- vapply(bars$metrics, function(metric) metric$name, "")
  # Metrics by devices: barplot() draws each column as one group.
  matrix_of <- function(key) {
    do.call(rbind, lapply(bars$metrics, function(metric) unlist(metric[[key]])))
  }
  shares <- matrix_of("shares")
  labels <- matrix_of("labels")
  devices <- unlist(bars$devices)
  colours <- unlist(plotting$COLOURS[metrics])
  centres <- graphics::barplot(
    shares, beside = TRUE, names.arg = sub("^/device:", "", devices),
    col = colours, border = NA, ylim = c(0, 1.25), ylab = "share of all devices",
    legend.text = metrics,
    args.legend = list(x = "top", horiz = TRUE, bty = "n", cex = 0.8, border = NA),
    ...
  )
  graphics::text(centres, shares, labels, srt = 90, adj = c(-0.1, 0.5), cex = 0.6)
  invisible(data.frame(
    device = rep(devices, each = length(metrics)),
    metric = rep(metrics, times = length(devices)),
    value = as.double(matrix_of("values")),
    share = as.vector(shares),
    label = as.vector(labels),
    stringsAsFactors = FALSE
  ))
}

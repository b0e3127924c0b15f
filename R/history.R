# The training history fit() and fit_distributed() return: Keras's
# `History` as one numeric vector per metric, printed as a table, plotted
# with base graphics, and converted to keras3's long data frame.

#' The R form of a Keras `History`: one numeric vector per metric.
#' @noRd
as_training_history <- function(history) {
  metrics <- lapply(history$history, function(values) {
    as.numeric(unlist(values))
  })
  structure(
    list(params = history$params, metrics = metrics,
         epochs = as.integer(unlist(history$epoch)) + 1L),
    class = c("multigpu_training_history", "keras_training_history")
  )
}

# Metric names in reading order: loss first, then the other training
# metrics, then their validation counterparts.
metric_order <- function(names) {
  validation <- grepl("^val_", names)
  base <- sub("^val_", "", names)
  names[order(validation, base != "loss")]
}

history_table <- function(x) {
  table <- data.frame(epoch = x$epochs)
  for (name in metric_order(names(x$metrics))) table[[name]] <- x$metrics[[name]]
  table
}

#' Print, plot and convert a training history
#'
#' A history prints as a table with one row per epoch and one column per
#' metric (long histories show their first and last epochs). `plot()` draws
#' one panel per metric with base graphics: the training values and, when
#' there was validation data, the validation values, per epoch.
#' `as.data.frame()` gives the long form keras3 uses: `epoch`, `value`,
#' `metric` and `data` (`"training"` or `"validation"`).
#'
#' @param x A training history, returned by
#'   [fit()][keras3::fit.keras.src.models.model.Model].
#' @param y Unused.
#' @param metrics Names of the metrics to plot, without the `val_` prefix
#'   (e.g. `c("loss", "accuracy")`); `NULL` for all.
#' @param max_rows The most epochs to print before eliding the middle ones.
#' @param row.names,optional Unused, for the `as.data.frame()` generic.
#' @param ... Further graphical parameters for [graphics::plot()], or unused.
#' @returns `print()` and `plot()` return `x` invisibly; `as.data.frame()`
#'   a data frame.
#' @family model training
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' strategy <- mirrored_strategy()
#' with(strategy$scope(), {
#'   model <- keras_model_sequential(input_shape = 4) |>
#'     layer_dense(1)
#'   model |> compile(loss = loss_mean_squared_error(), optimizer = optimizer_adam(),
#'                    metrics = list(metric_mean_absolute_error()))
#' })
#' x <- matrix(runif(400), ncol = 4)
#' data <- distributed_dataset(x, rowSums(x), per_replica_batch_size = 25,
#'                             strategy = strategy)
#' # fit_distributed() returns this history; so does fit() without keras3
#' history <- model |> fit_distributed(data, epochs = 4, verbose = 0)
#' history
#' plot(history)
#' head(as.data.frame(history))
print.multigpu_training_history <- function(x, max_rows = 10L, ...) {
  table <- history_table(x)
  n <- nrow(table)
  steps <- x$params$steps
  cat(sprintf("Training history: %d epoch%s%s\n", n,
              if (n == 1L) "" else "s",
              if (is.numeric(steps)) sprintf(", %d steps each", as.integer(steps))
              else ""))
  if (n == 0L) return(invisible(x))
  shown <- table
  for (name in names(table)[-1L]) {
    shown[[name]] <- formatC(table[[name]], digits = 4L, format = "fg",
                             flag = "#")
  }
  shown$epoch <- as.character(shown$epoch)
  if (n > max_rows) {
    half <- max(1L, as.integer(max_rows) %/% 2L)
    gap <- shown[1L, , drop = FALSE]
    gap[1L, ] <- "..."
    shown <- rbind(shown[seq_len(half), , drop = FALSE], gap,
                   shown[seq.int(n - half + 1L, n), , drop = FALSE])
  }
  print(shown, row.names = FALSE, right = TRUE)
  invisible(x)
}

#' @rdname print.multigpu_training_history
#' @export
plot.multigpu_training_history <- function(x, y, metrics = NULL, ...) {
  available <- unique(sub("^val_", "", metric_order(names(x$metrics))))
  metrics <- metrics %||% available
  unknown <- setdiff(metrics, available)
  if (length(unknown)) {
    multigpu_abort(sprintf(
      "`metrics` names metrics the history does not have: %s. It has: %s.",
      paste(unknown, collapse = ", "), paste(available, collapse = ", ")
    ))
  }
  old <- graphics::par(mfrow = c(length(metrics), 1L),
                       mar = c(3.2, 4.2, 0.6, 0.8), mgp = c(2.1, 0.7, 0))
  on.exit(graphics::par(old))
  colours <- c(training = "#1f77b4", validation = "#d62728")
  for (metric in metrics) {
    training <- x$metrics[[metric]]
    validation <- x$metrics[[paste0("val_", metric)]]
    values <- c(training, validation)
    graphics::plot(x$epochs, training %||% rep(NA_real_, length(x$epochs)),
                   type = "o", pch = 16, col = colours[["training"]],
                   ylim = range(values, finite = TRUE), xlab = "epoch",
                   ylab = metric, ...)
    if (!is.null(validation)) {
      graphics::lines(x$epochs, validation, type = "o", pch = 17,
                      col = colours[["validation"]])
      # Keep the legend off the curves: they end low when they fall.
      rising <- isTRUE(utils::tail(training, 1L) > training[[1L]])
      graphics::legend(if (rising) "bottomright" else "topright",
                       legend = names(colours), bty = "n",
                       col = colours, pch = c(16, 17), lty = 1, cex = 0.8)
    }
  }
  invisible(x)
}

#' @rdname print.multigpu_training_history
#' @export
as.data.frame.multigpu_training_history <- function(x, row.names = NULL,
                                                    optional = FALSE, ...) {
  names <- metric_order(names(x$metrics))
  metric <- sub("^val_", "", names)
  data.frame(
    epoch = rep(x$epochs, times = length(names)),
    value = unlist(x$metrics[names], use.names = FALSE),
    metric = factor(rep(metric, each = length(x$epochs)),
                    levels = unique(metric)),
    data = factor(rep(ifelse(grepl("^val_", names), "validation", "training"),
                      each = length(x$epochs)),
                  levels = c("training", "validation"))
  )
}

test_that("a history prints as a compact table, loss first", {
  history <- structure(
    list(params = list(verbose = 0L, epochs = 3L, steps = 5L),
         metrics = list(accuracy = c(0.5, 0.75, 0.875), loss = c(1.23456, 0.9, 0.5),
                        val_loss = c(1.5, 1.1, 0.7)),
         epochs = 1:3),
    class = c("multigpu_training_history", "keras_training_history"))
  output <- capture.output(print(history))
  expect_identical(output[[1]], "Training history: 3 epochs, 5 steps each")
  expect_match(output[[2]], "^ epoch +loss +accuracy +val_loss$")
  expect_match(output[[3]], "^ +1 +1.235 +0.5000 +1.500$")
  expect_length(output, 5L)
  capture.output(expect_invisible(print(history)))

  long <- history
  long$epochs <- 1:30
  long$metrics <- list(loss = seq(3, 0.1, length.out = 30))
  output <- capture.output(print(long, max_rows = 6))
  expect_identical(output[[1]], "Training history: 30 epochs, 5 steps each")
  expect_length(output, 2L + 3L + 1L + 3L)
  expect_match(output[[6]], "^ +\\.\\.\\. +\\.\\.\\.$")
  expect_match(output[[9]], "^ +30 ")
})

test_that("a history plots one base-graphics panel per metric and restores par()", {
  # The history fit_distributed() returns.
  history <- structure(
    list(params = list(), epochs = 1:3,
         metrics = list(loss = c(1, 0.8, 0.7), accuracy = c(0.5, 0.6, 0.7),
                        val_loss = c(1.1, 0.9, 0.8), val_accuracy = c(0.4, 0.5, 0.6))),
    class = c("multigpu_training_history", "keras_training_history"))
  file <- tempfile(fileext = ".png")
  grDevices::png(file, width = 480, height = 480)
  before <- graphics::par("mfrow")
  expect_invisible(plot(history))
  expect_identical(graphics::par("mfrow"), before)
  recorded <- grDevices::recordPlot()
  plot(history, metrics = "loss")
  grDevices::dev.off()
  expect_gt(file.size(file), 1000)
  expect_error(plot(history, metrics = c("loss", "auc")),
               "`metrics` names metrics the history does not have: auc. It has: loss, accuracy.",
               fixed = TRUE, class = "multigpu_value_error")
})

test_that("as.data.frame() gives keras3's long form", {
  history <- structure(
    list(params = list(), epochs = 1:2,
         metrics = list(accuracy = c(0.5, 0.7), loss = c(1, 0.8), val_loss = c(1.2, 0.9))),
    class = c("multigpu_training_history", "keras_training_history"))
  df <- as.data.frame(history)
  expect_identical(names(df), c("epoch", "value", "metric", "data"))
  expect_identical(nrow(df), 6L)
  expect_identical(df$epoch, rep(1:2, 3))
  expect_identical(df$value, c(1, 0.8, 0.5, 0.7, 1.2, 0.9))
  expect_identical(levels(df$metric), c("loss", "accuracy"))
  expect_identical(as.character(df$data), rep(c("training", "training", "validation"), each = 2))
})

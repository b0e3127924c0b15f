# R data for Keras (model-data.R): pure R, no Python needed.

test_that("as_model_data() turns factors of targets into 0-based class codes", {
  codes <- as_model_data(factor(c("b", "a", "c", "a")), arg = "y")
  expect_identical(codes, array(c(1L, 0L, 2L, 0L), dim = 4L))
  expect_identical(as_model_data(1:3), array(1:3, dim = 3L))
  expect_identical(as_model_data(c(TRUE, FALSE)), array(c(TRUE, FALSE), dim = 2L))
  expect_identical(as_model_data(matrix(1:4, 2)), matrix(1:4, 2))
  expect_identical(as_model_data(c("a", "b")), c("a", "b"))
  expect_null(as_model_data(NULL))
  expect_identical(as_model_data(list(NULL, 1:2)), list(NULL, array(1:2, dim = 2L)))
})

test_that("as_model_data() refuses what Keras cannot train on, naming the R argument and the fix", {
  expect_type_error <- function(expr, pattern) {
    expect_error(expr, pattern, class = "multigpu_type_error")
  }
  x <- data.frame(colour = c("red", "blue"), size = 1:2)
  expect_type_error(as_model_data(x),
                    "^`x` is a data frame with character column\\(s\\) \"colour\" beside numbers, which as.matrix\\(\\) turns into strings Keras cannot train on\\. Convert them to numbers first, e.g\\. x\\$colour <- as.integer\\(factor\\(x\\$colour\\)\\) - 1L")
  data <- data.frame(size = 1:2, kind = factor(c("a", "b")))
  expect_type_error(as_model_data(data), "`data` is a data frame with factor column\\(s\\) \"kind\".*data\\$kind <- as.integer\\(data\\$kind\\) - 1L")
  x <- factor(c("a", "b"))
  expect_type_error(as_model_data(x), "^`x` is a factor \\(c\\(\"a\", \"b\"\\)\\): factors are class labels, for `y`")
  y <- c("cat", "dog")
  # Not `x`: the argument that holds the strings.
  expect_type_error(as_model_data(y), "^`y` holds strings \\(c\\(\"cat\", \"dog\"\\)\\): Keras trains on numbers\\. For class labels pass a factor, y = factor\\(y\\)")
  expect_type_error(as_model_data(list(out = c("a", "b")), arg = "y"), "^`y\\$out` holds strings")
  sample_weight <- c("1", "2")
  expect_type_error(as_model_data(sample_weight), "as.numeric\\(sample_weight\\)")
  # What Keras takes: numbers, a targets data frame of one factor column,
  # strings as inputs (a model with a string input).
  expect_identical(as_model_data(data.frame(a = 1:2, b = c(TRUE, FALSE))),
                   matrix(c(1L, 2L, 1L, 0L), 2, dimnames = list(NULL, c("a", "b"))))
  expect_identical(as_model_data(data.frame(s = factor(c("b", "a"))), arg = "y"),
                   array(c(1L, 0L), dim = 2L))
  expect_identical(as_model_data(c("a", "b"), arg = "x"), c("a", "b"))
})

test_that("check_keras3_data() refuses every data frame, naming the argument and the R fix", {
  expect_type_error <- function(expr, pattern) {
    expect_error(expr, pattern, class = "multigpu_type_error", fixed = TRUE)
  }
  x <- data.frame(a = 1:2, b = c(0.5, 1))
  expect_type_error(check_keras3_data(x),
                    "`x` is a data frame (2 x 2), which keras3 would send to Keras as one input per column. Pass a matrix: as.matrix(x), or data.matrix(x) to turn factor columns into numbers.")
  y <- data.frame(class = factor(c("a", "b")))
  expect_type_error(check_keras3_data(y),
                    "`y` is a data frame (2 x 1), which keras3 would send to Keras as one target per column. Pass a vector or matrix: y[[1]] for one column (a factor goes as 0-based class codes), as.matrix(y) for numeric columns.")
  # Inside a list of inputs, the element is named as R writes it.
  expect_type_error(check_keras3_data(list(image = matrix(0, 2, 2), meta = x), "x"),
                    "`x$meta` is a data frame (2 x 2)")
  expect_type_error(check_keras3_data(factor(c("a", "b")), "x"), "`x` is a factor (c(\"a\", \"b\")): factors are class labels, for `y`.")
  expect_type_error(check_keras3_data(c("1", "2"), "sample_weight"), "Pass numbers, e.g. as.numeric(sample_weight).")
  # What keras3 converts itself passes: numbers, factors of labels, NULL.
  expect_null(check_keras3_data(NULL))
  expect_identical(check_keras3_data(factor(c("a", "b")), "y"), factor(c("a", "b")))
  expect_identical(check_keras3_data(list(a = 1:2, b = matrix(0, 2, 2)), "x"),
                   list(a = 1:2, b = matrix(0, 2, 2)))
})

test_that("check_validation_data() checks list(x_val, y_val) part by part", {
  expect_type_error <- function(expr, pattern) {
    expect_error(expr, pattern, class = "multigpu_type_error", fixed = TRUE)
  }
  validation_data <- list(matrix(0, 2, 2), c("a", "b"))
  expect_type_error(check_validation_data(validation_data),
                    "`validation_data[[2]]` holds strings (c(\"a\", \"b\")): Keras trains on numbers. For class labels pass a factor, validation_data[[2]] = factor(validation_data[[2]])")
  expect_type_error(check_validation_data(list(data.frame(a = 1:2), 1:2), "validation_data"),
                    "`validation_data[[1]]` is a data frame (2 x 1), which keras3 would send to Keras as one input per column. Pass a matrix: as.matrix(validation_data[[1]])")
  expect_type_error(check_validation_data(data.frame(a = 1:2), "validation_data"),
                    "`validation_data` is a data frame (2 x 1)")
  expect_identical(check_validation_data(list(matrix(0, 2, 2), factor(c("a", "b")))),
                   list(matrix(0, 2, 2), factor(c("a", "b"))))
})

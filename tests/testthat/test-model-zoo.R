# Published architectures through multi_gpu_model() from R: keras3's
# application_*() networks (weights = NULL) and a KerasHub task reached
# through reticulate, both engines (tests/python/engines/test_published_models.py checks
# their numbers in depth).

max_difference <- function(a, b) {
  max(mapply(function(u, v) max(abs(u - v)), keras3::get_weights(a), keras3::get_weights(b)))
}

tiny_gpt2 <- function(seed = 1L) {
  keras_py()$utils$set_random_seed(seed)
  hub <- reticulate::import("keras_hub")
  backbone <- hub$models$GPT2Backbone(
    vocabulary_size = 50L, num_layers = 1L, num_heads = 2L, hidden_dim = 8L,
    intermediate_dim = 16L, max_sequence_length = 8L, dropout = 0)
  hub$models$GPT2CausalLM(backbone = backbone, preprocessor = NULL)
}

token_data <- function(rows) {
  tokens <- matrix(sample.int(49L, rows * 9L, replace = TRUE), rows, 9L)
  list(x = list(token_ids = tokens[, 1:8],
                padding_mask = matrix(1L, rows, 8L)),
       y = tokens[, 2:9])
}

test_that("keras3's application_*() models give the template's predictions", {
  skip_if_no_multigpu()
  set.seed(1)
  images <- array(rnorm(6 * 32 * 32 * 3), c(6, 32, 32, 3))
  mobilenet <- keras3::application_mobilenet_v3_small(
    input_shape = c(32, 32, 3), weights = NULL, classes = 3,
    minimalistic = TRUE)
  parallel <- multi_gpu_model(mobilenet, gpus = 2)
  expect_equal(predict(parallel, images, verbose = 0),
               predict(mobilenet, images, verbose = 0), tolerance = 1e-5)
})

test_that("a compiled application trains with no second compile(), on the mirrored engine", {
  skip_if_no_multigpu()
  set.seed(2)
  vgg <- keras3::application_vgg16(input_shape = c(32, 32, 3), weights = NULL,
                           include_top = FALSE, pooling = "avg")
  reference <- keras3::clone_model(vgg)
  keras3::set_weights(reference, keras3::get_weights(vgg))
  for (model in list(vgg, reference)) {
    model |> compile(optimizer = keras3::optimizer_sgd(0.01), loss = "mse")
  }
  images <- array(rnorm(6 * 32 * 32 * 3), c(6, 32, 32, 3))
  targets <- matrix(rnorm(6 * 512), 6, 512)
  parallel <- multi_gpu_model(vgg, gpus = 2, engine = "mirrored")
  parallel |> fit(images, targets, batch_size = 6, epochs = 1, verbose = 0,
                  shuffle = FALSE)
  reference |> fit(images, targets, batch_size = 6, epochs = 1, verbose = 0,
                   shuffle = FALSE)
  expect_lt(max_difference(vgg, reference), 1e-5)
})

test_that("a KerasHub task trains as it comes, and compile() takes its defaults", {
  skip_if_no_multigpu()
  set.seed(3)
  data <- token_data(6)
  for (engine in zoo_engines("published", "keras_hub_task")) {
    task <- tiny_gpt2()
    reference <- tiny_gpt2()
    parallel <- multi_gpu_model(task, gpus = 2, engine = engine)
    # KerasHub compiled the task when building it: fit() needs no compile().
    parallel |> fit(data$x, data$y, batch_size = 6, epochs = 1, verbose = 0,
                    shuffle = FALSE)
    reference |> fit(data$x, data$y, batch_size = 6, epochs = 1, verbose = 0,
                     shuffle = FALSE)
    expect_lt(max_difference(task, reference), 1e-6)
    parallel |> compile(optimizer = "sgd", loss = "mse")
    expect_invisible(result <- parallel |> compile())
    expect_identical(result, parallel)
    expect_equal(class(parallel$optimizer)[[1]], "keras.src.optimizers.adam.Adam")
    expect_equal(parallel$optimizer$get_config()$learning_rate, 2e-5,
                 tolerance = 1e-6)
  }
})

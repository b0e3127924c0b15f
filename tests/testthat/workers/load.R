# Attaches multigpu in a worker script: the package under test from its
# source tree when MULTIGPU_R_SOURCE names one (testthat run from a
# checkout), else the installed package (R CMD check). Every script here
# sources it first, after keras3 where it uses keras3.
source_tree <- Sys.getenv("MULTIGPU_R_SOURCE")
if (nzchar(source_tree)) {
  pkgload::load_all(source_tree, quiet = TRUE)
} else {
  library(multigpu)
}

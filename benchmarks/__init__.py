"""lengthgen's benchmarks, by kind (benchmarks/README.md): a package of the checkout, not of the install."""

"""The test suite, a package mirroring the source tree: tests/ablate/grid/test_runner.py tests
ablate/grid/runner.py. Every folder is a package so that pytest imports a test file by its
dotted path from the repository root (tests.ablate.test_train and tests.ablate.commands.test_train
are two modules), and never puts tests/ itself on sys.path, where tests/ablate/ would stand in
for the real ablate."""

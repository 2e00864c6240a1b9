// Compiles the test suite's precompiled header (tests/CMakeLists.txt); every test reuses it.

# Run after each build of a test program (tests/CMakeLists.txt, xgrad_label_gemm_cases): writes
# OUTPUT, which gives the program's test cases tagged [gemm] (hidden ones aside) the ctest label
# gemm when ctest reads the tests. Script mode: cmake -D TEST_EXECUTABLE=... -D TEST_PREFIX=...
# -D OUTPUT=... -P label_gemm_cases.cmake
execute_process(COMMAND "${TEST_EXECUTABLE}" "[gemm]~[.]" --list-test-names-only
                OUTPUT_VARIABLE names RESULT_VARIABLE result)
if(result LESS 0)
  message(FATAL_ERROR "label_gemm_cases: '${TEST_EXECUTABLE}' could not list its test cases: ${result}")
endif()
string(REPLACE "\n" ";" names "${names}")  # names with ';' are refused at configure time
set(script "")
foreach(name ${names})
  if(NOT name STREQUAL "")
    string(APPEND script "set_tests_properties([==[${TEST_PREFIX}${name}]==] PROPERTIES LABELS gemm)\n")
  endif()
endforeach()
file(WRITE "${OUTPUT}" "${script}")

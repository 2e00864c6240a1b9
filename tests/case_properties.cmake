# Run after each build of a test program (tests/CMakeLists.txt, xgrad_case_properties): writes
# OUTPUT, which gives the program's test cases (hidden ones aside) the ctest properties their tags
# ask for when ctest reads the tests:
#   [gemm]  the label gemm (the engine passes of scripts/run_tests.sh run these again);
#   [long]  COST 100, so that ctest starts them before the short ones and no long case is left to
#           run alone at the end of a pass. ctest's own record of earlier runs' times cannot order
#           these cases: it cuts each name at its first space.
# Script mode: cmake -D TEST_EXECUTABLE=... -D TEST_PREFIX=... -D OUTPUT=... -P case_properties.cmake
set(script "")
foreach(tag gemm long)
  execute_process(COMMAND "${TEST_EXECUTABLE}" "[${tag}]~[.]" --list-test-names-only
                  OUTPUT_VARIABLE names RESULT_VARIABLE result)
  if(result LESS 0)
    message(FATAL_ERROR "case_properties: '${TEST_EXECUTABLE}' could not list its test cases: ${result}")
  endif()
  if(tag STREQUAL "gemm")
    set(property "LABELS gemm")
  else()
    set(property "COST 100")
  endif()
  string(REPLACE "\n" ";" names "${names}")  # names with ';' are refused at configure time
  foreach(name ${names})
    if(NOT name STREQUAL "")
      string(APPEND script "set_tests_properties([==[${TEST_PREFIX}${name}]==] PROPERTIES ${property})\n")
    endif()
  endforeach()
endforeach()
file(WRITE "${OUTPUT}" "${script}")

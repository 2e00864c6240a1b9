# The C++ snippets of README.md and docs/**/*.md as tests: every ```cpp block is a complete
# program, extracted at configure time into doc_snippets/, built against xgrad and run by ctest
# as "doc_snippet: PAGE:LINE" (the line of its opening fence). Editing a page re-configures.
# A block that includes xgrad/distributed/ links xgrad::distributed, runs alone and on two ranks
# (mpirun), and is left out without the distributed library; one that includes xgrad/text/
# links xgrad::text.

cmake_policy(SET CMP0110 NEW)  # test names with spaces and colons
set(XGRAD_SNIPPET_DIR ${CMAKE_CURRENT_BINARY_DIR}/doc_snippets)
file(MAKE_DIRECTORY ${XGRAD_SNIPPET_DIR})
file(GLOB_RECURSE XGRAD_DOC_PAGES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/docs/*.md)
list(PREPEND XGRAD_DOC_PAGES ${PROJECT_SOURCE_DIR}/README.md)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${XGRAD_DOC_PAGES})

# One precompiled <xgrad/xgrad.hpp> for every snippet: parsing it is most of a snippet's build.
file(WRITE ${XGRAD_SNIPPET_DIR}/pch.cpp.new "// The target that owns the snippets' precompiled header.\n")
configure_file(${XGRAD_SNIPPET_DIR}/pch.cpp.new ${XGRAD_SNIPPET_DIR}/pch/pch.cpp COPYONLY)
file(REMOVE ${XGRAD_SNIPPET_DIR}/pch.cpp.new)
add_library(doc_snippet_pch OBJECT ${XGRAD_SNIPPET_DIR}/pch/pch.cpp)
target_link_libraries(doc_snippet_pch PRIVATE xgrad::xgrad)
target_compile_options(doc_snippet_pch PRIVATE -Wall -Wextra ${XGRAD_TEST_COMPILE_OPTIONS})
target_precompile_headers(doc_snippet_pch PRIVATE <xgrad/xgrad.hpp>)

set(fence "```")
set(XGRAD_SNIPPET_SOURCES "")
set(XGRAD_SNIPPET_TARGETS "")
foreach(page ${XGRAD_DOC_PAGES})
  file(RELATIVE_PATH page_name ${PROJECT_SOURCE_DIR} ${page})
  file(READ ${page} text)
  set(text "\n${text}")  # so a fence on the first line starts with a newline too
  set(pos 0)
  while(TRUE)
    string(SUBSTRING "${text}" ${pos} -1 rest)
    string(FIND "${rest}" "\n${fence}cpp\n" start)
    if(start EQUAL -1)
      break()
    endif()
    math(EXPR fence_at "${pos} + ${start} + 1")
    math(EXPR code_at "${fence_at} + 7")
    string(SUBSTRING "${text}" 0 ${fence_at} before)
    string(REGEX REPLACE "[^\n]" "" newlines "${before}")
    string(LENGTH "${newlines}" line)  # the fence's line: the newlines before it, less the one added
    string(SUBSTRING "${text}" ${code_at} -1 rest)
    string(FIND "${rest}" "\n${fence}" end)
    if(end EQUAL -1)
      message(FATAL_ERROR "${page_name}:${line}: a ${fence}cpp block that is never closed")
    endif()
    math(EXPR end "${end} + 1")
    string(SUBSTRING "${rest}" 0 ${end} code)
    math(EXPR pos "${code_at} + ${end}")

    string(MAKE_C_IDENTIFIER "${page_name}_${line}" id)
    set(source ${XGRAD_SNIPPET_DIR}/${id}.cpp)
    file(WRITE ${source}.new "// ${page_name}:${line}\n${code}")
    configure_file(${source}.new ${source} COPYONLY)  # rewritten only when the snippet changed
    file(REMOVE ${source}.new)
    list(APPEND XGRAD_SNIPPET_SOURCES ${source})

    set(libraries xgrad::xgrad)
    string(FIND "${code}" "xgrad/text/" uses_text)
    if(NOT uses_text EQUAL -1)
      set(libraries xgrad::text)
    endif()
    string(FIND "${code}" "xgrad/distributed/" distributed)
    if(NOT distributed EQUAL -1)
      if(NOT TARGET xgrad_distributed)
        message(STATUS "xgrad: ${page_name}:${line} needs the distributed library, which is not built: not tested")
        continue()
      endif()
      set(libraries xgrad::distributed)
    endif()
    add_executable(doc_${id} ${source})
    target_link_libraries(doc_${id} PRIVATE ${libraries})
    target_compile_options(doc_${id} PRIVATE -Wall -Wextra ${XGRAD_TEST_COMPILE_OPTIONS})
    target_precompile_headers(doc_${id} REUSE_FROM doc_snippet_pch)
    list(APPEND XGRAD_SNIPPET_TARGETS doc_${id})
    file(MAKE_DIRECTORY ${XGRAD_SNIPPET_DIR}/run/${id})  # each runs in a folder of its own
    add_test(NAME "doc_snippet: ${page_name}:${line}" COMMAND doc_${id}
             WORKING_DIRECTORY ${XGRAD_SNIPPET_DIR}/run/${id})
    # A snippet is a program whose products run under the XGRAD_GEMM it inherits.
    set_tests_properties("doc_snippet: ${page_name}:${line}" PROPERTIES TIMEOUT 60 LABELS gemm)
    if(NOT distributed EQUAL -1)  # and on two ranks, as the page means it to run
      add_test(NAME "doc_snippet: ${page_name}:${line} (2 ranks)" COMMAND ${XGRAD_MPIRUN} -np 2 $<TARGET_FILE:doc_${id}>
               WORKING_DIRECTORY ${XGRAD_SNIPPET_DIR}/run/${id})
      set_tests_properties("doc_snippet: ${page_name}:${line} (2 ranks)" PROPERTIES TIMEOUT 120 RUN_SERIAL TRUE LABELS gemm
                          ENVIRONMENT "${XGRAD_MPI_ASAN}")  # see the distributed tests
    endif()
  endwhile()
endforeach()

# Snippets of an earlier configure that no page holds any more.
file(GLOB old_sources ${XGRAD_SNIPPET_DIR}/*.cpp)
foreach(old ${old_sources})
  if(NOT old IN_LIST XGRAD_SNIPPET_SOURCES)
    file(REMOVE ${old})
  endif()
endforeach()
# `cmake --build build --target doc_snippets` builds them all.
add_custom_target(doc_snippets DEPENDS ${XGRAD_SNIPPET_TARGETS})

# Lists a GoogleTest executable's suites and writes a CTest file with one test per suite (the
# suite's tests in one process: a process of these executables takes 0.5-1 s to start, cuBLASLt's
# initializers or the sanitizers' set-up, more than most tests take). Run after each build of the
# executable (tests/CMakeLists.txt, kvpr_gtest_suites):
#   cmake -D EXE=... -D OUT=... -D PREFIX=... -D ENV=... -D LABELS=... -D TIMEOUT=... -P gtest_suites.cmake
execute_process(COMMAND "${EXE}" --gtest_list_tests OUTPUT_VARIABLE listing RESULT_VARIABLE rc TIMEOUT 60)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXE} --gtest_list_tests failed (${rc}): ${listing}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(content "")
foreach(line IN LISTS lines)
  # A suite is an unindented line "Suite." or "Prefix/Suite.", perhaps with "  # TypeParam = ...".
  if(line MATCHES "^([A-Za-z0-9_/]+)\\.")
    set(suite "${CMAKE_MATCH_1}")
    set(name "${PREFIX}${suite}")
    string(APPEND content "add_test([=[${name}]=] [=[${EXE}]=] [=[--gtest_filter=${suite}.*]=])\n")
    string(APPEND content "set_tests_properties([=[${name}]=] PROPERTIES ENVIRONMENT [=[${ENV}]=] LABELS [=[${LABELS}]=] TIMEOUT ${TIMEOUT})\n")
  endif()
endforeach()
file(WRITE "${OUT}" "${content}")

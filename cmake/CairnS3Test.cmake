# Tests against a real S3 server: a single-node Ceph cluster with radosgw
# (scripts/ceph/ceph.sh), started by ctest as the fixture `ceph` and stopped
# after the last test that needs it. Every S3 test carries label `s3`, needs
# that fixture and gets the server's AWS_* settings, so
#   ctest -L s3            starts Ceph, runs the S3 tests, stops Ceph;
#   ctest -R s3_shard_store   the same for one test.
# The tests never skip when the server is missing: if Ceph cannot start, the
# fixture fails and ctest reports every test that needed it as failed.
#
# The fixture's cluster lives in <build>/ceph on radosgw port
# CAIRN_S3_TEST_PORT (default 7481; its monitor on the port - 700), so it
# does not collide with a developer's cluster on ceph.sh's default 7480.
set(CAIRN_S3_TEST_PORT 7481 CACHE STRING
  "radosgw port of the Ceph cluster the S3 tests start (ctest fixture ceph)")
set(_cairn_ceph_sh ${PROJECT_SOURCE_DIR}/scripts/ceph/ceph.sh)
set(_cairn_ceph_dir ${PROJECT_BINARY_DIR}/ceph)
math(EXPR _cairn_tls_port "${CAIRN_S3_TEST_PORT} + 1000")

# The settings an S3 test process gets (a CMake list; as one ENVIRONMENT
# property value).
set(CAIRN_S3_TEST_ENVIRONMENT
  "AWS_ENDPOINT_URL=http://127.0.0.1:${CAIRN_S3_TEST_PORT}"
  "AWS_ACCESS_KEY_ID=cairn"
  "AWS_SECRET_ACCESS_KEY=cairnsecret"
  "AWS_REGION=us-east-1"
  "CAIRN_CEPH_DIR=${_cairn_ceph_dir}"
  "CAIRN_CEPH_PORT=${CAIRN_S3_TEST_PORT}"
  "CAIRN_CEPH_SH=${_cairn_ceph_sh}"
  "CAIRN_S3_TLS_ENDPOINT=https://127.0.0.1:${_cairn_tls_port}"
  "CAIRN_S3_TLS_CA=${_cairn_ceph_dir}/tls/ca.crt")

add_test(NAME ceph_start
  COMMAND ${_cairn_ceph_sh} start --dir ${_cairn_ceph_dir}
          --port ${CAIRN_S3_TEST_PORT})
set_tests_properties(ceph_start PROPERTIES
  FIXTURES_SETUP ceph LABELS "s3" TIMEOUT 300 RESOURCE_LOCK ceph_cluster)
add_test(NAME ceph_stop
  COMMAND ${_cairn_ceph_sh} stop --dir ${_cairn_ceph_dir}
          --port ${CAIRN_S3_TEST_PORT})
set_tests_properties(ceph_stop PROPERTIES
  FIXTURES_CLEANUP ceph LABELS "s3" TIMEOUT 60 RESOURCE_LOCK ceph_cluster)

# cairn_s3_test(NAME SRCS ... [DEPS ...] [TIMEOUT seconds] [RUN_SERIAL]): a
# gtest binary run against the fixture's server, as one ctest (its cases one
# after another in one process; gtest_discover_tests would split the
# environment list).
function(cairn_s3_test name)
  cmake_parse_arguments(T "RUN_SERIAL" "TIMEOUT" "SRCS;DEPS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  add_executable(${name} ${T_SRCS})
  target_compile_options(${name} PRIVATE ${CAIRN_WARNINGS})
  target_link_libraries(${name} PRIVATE ${T_DEPS} cairn_common_testing
    GTest::gmock GTest::gtest_main)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES
    LABELS "s3" FIXTURES_REQUIRED ceph TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "${CAIRN_S3_TEST_ENVIRONMENT}")
  if(T_RUN_SERIAL)
    set_tests_properties(${name} PROPERTIES RUN_SERIAL TRUE)
  endif()
endfunction()

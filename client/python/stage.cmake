# Stages the cairn package (cmake -P, run by the cairn_python target):
# copies cairn/*.py, *.pyi and py.typed from SRC_DIR into DST_DIR/cairn
# (only when changed), removes staged Python files whose source is gone,
# copies libcairn (LIBCAIRN) as DST_DIR/cairn/LIBCAIRN_SONAME, and puts
# pyproject.toml (VERSION filled in) and setup.py next to cairn/ so
# `pip install DST_DIR` works.
cmake_minimum_required(VERSION 3.24)
foreach(var SRC_DIR DST_DIR LIBCAIRN LIBCAIRN_SONAME VERSION)
  if(NOT ${var})
    message(FATAL_ERROR "stage.cmake: ${var} is not set")
  endif()
endforeach()

set(pkg "${DST_DIR}/cairn")
file(MAKE_DIRECTORY "${pkg}")
file(GLOB sources "${SRC_DIR}/cairn/*.py" "${SRC_DIR}/cairn/*.pyi"
  "${SRC_DIR}/cairn/py.typed")
set(wanted "")
foreach(src IN LISTS sources)
  get_filename_component(name "${src}" NAME)
  list(APPEND wanted "${name}")
  file(COPY_FILE "${src}" "${pkg}/${name}" ONLY_IF_DIFFERENT)
endforeach()
file(GLOB staged "${pkg}/*.py" "${pkg}/*.pyi" "${pkg}/py.typed")
foreach(old IN LISTS staged)
  get_filename_component(name "${old}" NAME)
  if(NOT name IN_LIST wanted)
    file(REMOVE "${old}")
  endif()
endforeach()
file(COPY_FILE "${LIBCAIRN}" "${pkg}/${LIBCAIRN_SONAME}" ONLY_IF_DIFFERENT)
# What an in-place `pip install DST_DIR` leaves behind (setuptools' build/
# and egg-info): removed, so a later install never picks up stale copies.
file(REMOVE_RECURSE "${DST_DIR}/build" "${DST_DIR}/cairn.egg-info")
set(CAIRN_VERSION "${VERSION}")
configure_file("${SRC_DIR}/pyproject.toml" "${DST_DIR}/pyproject.toml" @ONLY)
file(COPY_FILE "${SRC_DIR}/setup.py" "${DST_DIR}/setup.py" ONLY_IF_DIFFERENT)

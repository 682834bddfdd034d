# Installation of Cairn: libcairn as a versioned shared library with its
# public headers, a CMake package (find_package(cairn) -> cairn::client,
# cairn::agent_client), a pkg-config file (cairn.pc) and the binaries.
#
# Everything install-related is decided here, from three lists below; the
# packages' CMakeLists.txt need no install() rules of their own:
#   CAIRN_PUBLIC_HEADERS   the headers a user includes. Installed with every
#                          project header they include, transitively (found
#                          by scanning their #include "..." lines), under
#                          include/cairn/<path>.
#   CAIRN_LIBCAIRN_ROOTS   the in-tree static libraries libcairn.so is made
#                          of, with every in-tree static library they link,
#                          transitively (whole archives, so self-registering
#                          objects such as storage drivers are kept).
#                          Packages may add to it: cairn_libcairn_add(target).
#   CAIRN_INSTALL_BINARIES the executables installed into bin/.
#
# libcairn's link interface (cairn::client's INTERFACE_LINK_LIBRARIES, and
# cairn.pc's Requires) is what the installed headers need: the external
# targets the bundle links PUBLIC whose headers they include (today only
# Abseil). Everything else (gRPC, protobuf, spdlog, ISA-L, ...) is linked
# into libcairn.so, so consumers need only those packages' runtime
# libraries.
#
# The in-tree build keeps its static libraries: only the libraries that go
# into libcairn.so are compiled position-independent, and libcairn.so is a
# separate target (cairn_client_shared) that nothing in the tree links.
#
# Installed layout (prefix P):
#   P/include/cairn/client/checkpointer.h ...      #include <cairn/client/...>
#   P/lib/libcairn.so.MAJOR.MINOR.PATCH, libcairn.so.MAJOR, libcairn.so
#   P/lib/cmake/cairn/cairnConfig.cmake, cairnConfigVersion.cmake, targets
#   P/lib/pkgconfig/cairn.pc
#   P/bin/cairnd, cairn, cairn-agent
# The package's include directories are P/include (for <cairn/...>) and
# P/include/cairn (so the installed headers' own #include "planner/box.h"
# lines resolve).
#
# Symbol visibility: default. libcairn.so exports every symbol of the code it
# is made of (the public headers expose planner and storage types, whose
# out-of-line functions consumers call); hiding internals would need export
# annotations throughout the tree.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(CAIRN_PUBLIC_HEADERS
  client/checkpointer.h
  client/state_dict.h
  client/agent/agent_checkpointer.h
  common/status_macros.h)
set(CAIRN_LIBCAIRN_ROOTS cairn_client cairn_agent_client)
set(CAIRN_INSTALL_BINARIES cairnd cairn cairn-agent)

set(CAIRN_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/cairn")

# cairn_libcairn_add(target...): also build `target` (and what it links) into
# libcairn.so, for libraries no root links but a client needs at run time
# (e.g. a storage driver that registers its URI scheme).
function(cairn_libcairn_add)
  set_property(GLOBAL APPEND PROPERTY CAIRN_LIBCAIRN_EXTRA ${ARGN})
endfunction()

# How consumers find the packages behind imported targets that libcairn's
# interface names: namespace -> find_dependency() arguments.
set(_CAIRN_DEP_absl "absl CONFIG")
set(_CAIRN_DEP_gRPC "gRPC CONFIG")
set(_CAIRN_DEP_protobuf "Protobuf")
set(_CAIRN_DEP_spdlog "spdlog CONFIG")
set(_CAIRN_DEP_nlohmann_json "nlohmann_json CONFIG")
set(_CAIRN_DEP_CLI11 "CLI11 CONFIG")
set(_CAIRN_DEP_Threads "Threads")
set(_CAIRN_DEP_CUDA "CUDAToolkit")
# The include directory of each namespace's headers: libcairn's interface
# keeps a namespace's targets only if an installed header includes from it
# (e.g. absl/...); the rest are linked into libcairn.so and consumers need
# neither their headers nor their CMake/pkg-config packages.
set(_CAIRN_INCLUDE_absl "absl")
set(_CAIRN_INCLUDE_gRPC "grpcpp;grpc")
set(_CAIRN_INCLUDE_protobuf "google")
set(_CAIRN_INCLUDE_spdlog "spdlog")
set(_CAIRN_INCLUDE_nlohmann_json "nlohmann")
set(_CAIRN_INCLUDE_CLI11 "CLI")

# The pkg-config module (or linker flag) for an imported target in libcairn's
# interface; FATAL_ERROR for one this file does not know.
function(_cairn_pkg_config_item item out_module out_flag)
  set(module "")
  set(flag "")
  if(item MATCHES "^absl::(.+)$")
    set(module "absl_${CMAKE_MATCH_1}")
  elseif(item MATCHES "^gRPC::(grpc\\+\\+|grpc\\+\\+_reflection|grpc|gpr)$")
    set(module "${CMAKE_MATCH_1}")
  elseif(item STREQUAL "protobuf::libprotobuf")
    set(module protobuf)
  elseif(item STREQUAL "spdlog::spdlog")
    set(module spdlog)
  elseif(item STREQUAL "nlohmann_json::nlohmann_json")
    set(module nlohmann_json)
  elseif(item STREQUAL "Threads::Threads")
    set(flag "-pthread")
  else()
    message(FATAL_ERROR "cmake/CairnInstall.cmake: libcairn's interface links "
      "'${item}'; add its pkg-config module to _cairn_pkg_config_item")
  endif()
  set(${out_module} "${module}" PARENT_SCOPE)
  set(${out_flag} "${flag}" PARENT_SCOPE)
endfunction()

# Walks the link graph from `roots`: every in-tree library reached (through
# PRIVATE links too: they end up inside libcairn.so), every external item
# they link, and the external targets they link PUBLIC (headers and inline
# code of libcairn's consumers may use them, so they are libcairn's
# interface).
function(_cairn_link_closure out_internal out_external out_public roots)
  set(queue ${roots})
  set(internal "")
  set(external "")
  set(public "")
  while(queue)
    list(POP_FRONT queue t)
    if(t IN_LIST internal)
      continue()
    endif()
    get_target_property(type ${t} TYPE)
    get_target_property(imported ${t} IMPORTED)
    if(imported OR NOT type MATCHES "^(STATIC_LIBRARY|INTERFACE_LIBRARY)$")
      message(FATAL_ERROR "cmake/CairnInstall.cmake: libcairn is built from "
        "in-tree static libraries, but '${t}' is a ${type}")
    endif()
    list(APPEND internal ${t})
    set(items "")
    if(NOT type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(items ${t} LINK_LIBRARIES)
    endif()
    get_target_property(iface ${t} INTERFACE_LINK_LIBRARIES)
    # $<LINK_LIBRARY:FEATURE,a,b> (e.g. a storage driver's archive linked
    # whole): its items, as plain items (libcairn links every in-tree
    # archive whole anyway).
    set(unwrapped "")
    foreach(item IN LISTS items iface)
      if(item MATCHES "^\\$<LINK_LIBRARY:[A-Za-z0-9_]+,(.+)>$")
        string(REPLACE "," ";" inner "${CMAKE_MATCH_1}")
        list(APPEND unwrapped ${inner})
      elseif(item MATCHES "^\\$<LINK_ONLY:\\$<LINK_LIBRARY:[A-Za-z0-9_]+,(.+)>>$")
        string(REPLACE "," ";" inner "${CMAKE_MATCH_1}")
        foreach(i IN LISTS inner)
          list(APPEND unwrapped "$<LINK_ONLY:${i}>")
        endforeach()
      else()
        list(APPEND unwrapped "${item}")
      endif()
    endforeach()
    foreach(item IN LISTS unwrapped)
      if(NOT item OR item MATCHES "-NOTFOUND$")
        continue()
      endif()
      set(link_only FALSE)
      if(item MATCHES "^\\$<LINK_ONLY:(.+)>$")
        set(item "${CMAKE_MATCH_1}")
        set(link_only TRUE)
      endif()
      if(item MATCHES "\\$<")
        message(FATAL_ERROR "cmake/CairnInstall.cmake: cannot classify the "
          "link item '${item}' of ${t}")
      endif()
      if(TARGET ${item})
        get_target_property(item_imported ${item} IMPORTED)
        if(NOT item_imported)
          list(APPEND queue ${item})
          continue()
        endif()
      endif()
      if(NOT item IN_LIST external)
        list(APPEND external ${item})
      endif()
      # External: an imported target linked PUBLIC (in the interface, not
      # LINK_ONLY) is part of libcairn's interface. Everything else is only
      # linked into libcairn.so: PRIVATE targets, and plain library names
      # and paths (which carry no usage requirements; CMake does not mark
      # them LINK_ONLY, so PUBLIC cannot be told from PRIVATE for them).
      if(TARGET ${item} AND NOT link_only AND item IN_LIST iface AND
         NOT item IN_LIST public)
        list(APPEND public ${item})
      endif()
    endforeach()
  endwhile()
  set(${out_internal} ${internal} PARENT_SCOPE)
  set(${out_external} ${external} PARENT_SCOPE)
  set(${out_public} ${public} PARENT_SCOPE)
endfunction()

# The project headers `roots` include, transitively (paths relative to the
# source dir), and the top directories of the other headers they include
# (absl, ...). Re-runs configure when one of them changes. Includes of
# anything else are dependencies' headers (absl/..., <vector>); a public
# header must not include generated proto/gRPC code (tests/install checks).
function(_cairn_header_closure out_headers out_external_dirs roots)
  set(queue ${roots})
  set(seen "")
  set(external_dirs "")
  while(queue)
    list(POP_FRONT queue h)
    if(h IN_LIST seen)
      continue()
    endif()
    if(NOT EXISTS "${PROJECT_SOURCE_DIR}/${h}")
      message(FATAL_ERROR "cmake/CairnInstall.cmake: public header ${h} "
        "does not exist")
    endif()
    list(APPEND seen ${h})
    set_property(DIRECTORY "${PROJECT_SOURCE_DIR}" APPEND PROPERTY
      CMAKE_CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/${h}")
    file(STRINGS "${PROJECT_SOURCE_DIR}/${h}" lines
      REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<][^\">]+[\">]")
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^[^\"<]*[\"<]([^\">]+)[\">].*$" "\\1" inc
        "${line}")
      if(line MATCHES "\"" AND EXISTS "${PROJECT_SOURCE_DIR}/${inc}" AND
         NOT IS_DIRECTORY "${PROJECT_SOURCE_DIR}/${inc}")
        list(APPEND queue ${inc})
      elseif(inc MATCHES "^([^/]+)/")
        list(APPEND external_dirs ${CMAKE_MATCH_1})
      endif()
    endforeach()
  endwhile()
  list(SORT seen)
  list(REMOVE_DUPLICATES external_dirs)
  set(${out_headers} ${seen} PARENT_SCOPE)
  set(${out_external_dirs} ${external_dirs} PARENT_SCOPE)
endfunction()

# Called once at the end of the top-level CMakeLists.txt, after every
# package has defined its targets.
function(cairn_finalize_install)
  get_property(extra GLOBAL PROPERTY CAIRN_LIBCAIRN_EXTRA)
  set(roots ${CAIRN_LIBCAIRN_ROOTS} ${extra})
  _cairn_link_closure(bundle external public_links "${roots}")
  _cairn_header_closure(headers header_dirs "${CAIRN_PUBLIC_HEADERS}")

  # libcairn's interface: the external targets the bundle links PUBLIC
  # whose headers the installed headers include (Threads always).
  set(public "")
  foreach(item IN LISTS public_links)
    set(keep TRUE)
    set(ns "")
    if(item MATCHES "^([A-Za-z0-9_]+)::")
      set(ns "${CMAKE_MATCH_1}")
    endif()
    if(ns AND DEFINED _CAIRN_INCLUDE_${ns})
      set(keep FALSE)
      foreach(dir IN LISTS _CAIRN_INCLUDE_${ns})
        if(dir IN_LIST header_dirs)
          set(keep TRUE)
        endif()
      endforeach()
    endif()
    if(keep)
      list(APPEND public ${item})
    endif()
  endforeach()

  # libcairn.so: the bundle's archives, each linked whole exactly once (a
  # repeated whole archive defines everything twice, so the archives are
  # given by path rather than through CMake's link graph, which repeats
  # static libraries), then what they link.
  set(static_bundle "")
  set(archives "")
  foreach(t IN LISTS bundle)
    get_target_property(type ${t} TYPE)
    if(type STREQUAL "STATIC_LIBRARY")
      list(APPEND static_bundle ${t})
      list(APPEND archives "$<TARGET_FILE:${t}>")
      set_property(TARGET ${t} PROPERTY POSITION_INDEPENDENT_CODE ON)
    endif()
  endforeach()
  if(public)
    list(REMOVE_ITEM external ${public})
  endif()
  file(WRITE "${PROJECT_BINARY_DIR}/cairn_client_shared.cc"
    "// libcairn.so is made of whole static archives (cmake/CairnInstall.cmake).\n")
  add_library(cairn_client_shared SHARED
    "${PROJECT_BINARY_DIR}/cairn_client_shared.cc")
  target_link_libraries(cairn_client_shared
    PRIVATE -Wl,--whole-archive ${archives} -Wl,--no-whole-archive ${external}
    PUBLIC ${public})
  add_dependencies(cairn_client_shared ${static_bundle})
  set_property(TARGET cairn_client_shared PROPERTY LINK_DEPENDS ${archives})
  # Definitions the bundle's headers need (e.g. CAIRN_HAVE_CUDA).
  set(defs "")
  foreach(t IN LISTS bundle)
    get_target_property(d ${t} INTERFACE_COMPILE_DEFINITIONS)
    if(d)
      list(APPEND defs ${d})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES defs)
  target_compile_definitions(cairn_client_shared INTERFACE ${defs})
  target_compile_features(cairn_client_shared INTERFACE cxx_std_17)
  target_include_directories(cairn_client_shared INTERFACE
    "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>"
    "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/cairn>")
  set_target_properties(cairn_client_shared PROPERTIES
    OUTPUT_NAME cairn
    EXPORT_NAME client
    VERSION ${PROJECT_VERSION}
    SOVERSION ${PROJECT_VERSION_MAJOR})
  if(NOT CAIRN_FUZZ)
    # Refuse to build a libcairn.so with unresolved symbols (sanitizer
    # builds leave the runtime's symbols to the executable).
    target_link_options(cairn_client_shared PRIVATE "LINKER:--no-undefined")
  endif()

  # Agent mode lives in the same library; a target of its own so consumers
  # say what they use (and a later split changes nothing for them).
  add_library(cairn_agent_client_package INTERFACE)
  target_link_libraries(cairn_agent_client_package
    INTERFACE cairn_client_shared)
  set_target_properties(cairn_agent_client_package PROPERTIES
    EXPORT_NAME agent_client)

  install(TARGETS cairn_client_shared cairn_agent_client_package
    EXPORT cairnTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT cairnTargets NAMESPACE cairn::
    DESTINATION ${CAIRN_INSTALL_CMAKEDIR})

  # Headers.
  foreach(h IN LISTS headers)
    get_filename_component(dir "${h}" DIRECTORY)
    install(FILES "${PROJECT_SOURCE_DIR}/${h}"
      DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/cairn/${dir}")
  endforeach()
  list(LENGTH headers n_headers)
  list(LENGTH static_bundle n_libs)
  message(STATUS "libcairn: made of ${n_libs} static libraries; "
    "${n_headers} headers installed; interface: ${public}")

  # CMake package: find_dependency() for every package behind the
  # interface's imported targets.
  set(namespaces "")
  set(pc_requires "")
  set(pc_flags "")
  foreach(item IN LISTS public)
    if(item MATCHES "^([A-Za-z0-9_]+)::")
      list(APPEND namespaces ${CMAKE_MATCH_1})
    endif()
    _cairn_pkg_config_item(${item} module flag)
    list(APPEND pc_requires ${module})
    list(APPEND pc_flags ${flag})
  endforeach()
  list(REMOVE_DUPLICATES namespaces)
  set(CAIRN_FIND_DEPENDENCIES "")
  foreach(ns IN LISTS namespaces)
    if(NOT DEFINED _CAIRN_DEP_${ns})
      message(FATAL_ERROR "cmake/CairnInstall.cmake: libcairn's interface "
        "links ${ns}:: targets; add how to find them (_CAIRN_DEP_${ns})")
    endif()
    string(APPEND CAIRN_FIND_DEPENDENCIES
      "find_dependency(${_CAIRN_DEP_${ns}})\n")
  endforeach()
  configure_package_config_file(
    "${PROJECT_SOURCE_DIR}/cmake/cairnConfig.cmake.in"
    "${PROJECT_BINARY_DIR}/cairnConfig.cmake"
    INSTALL_DESTINATION ${CAIRN_INSTALL_CMAKEDIR})
  write_basic_package_version_file(
    "${PROJECT_BINARY_DIR}/cairnConfigVersion.cmake"
    VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
  install(FILES "${PROJECT_BINARY_DIR}/cairnConfig.cmake"
    "${PROJECT_BINARY_DIR}/cairnConfigVersion.cmake"
    DESTINATION ${CAIRN_INSTALL_CMAKEDIR})

  # pkg-config: relocatable (prefix from the .pc file's own location).
  list(REMOVE_DUPLICATES pc_requires)
  list(REMOVE_DUPLICATES pc_flags)
  list(JOIN pc_requires " " CAIRN_PC_REQUIRES)
  list(JOIN pc_flags " " CAIRN_PC_LIBS)
  set(pcdir "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
  file(RELATIVE_PATH CAIRN_PC_PREFIX "/${pcdir}" "/")
  string(REGEX REPLACE "/$" "" CAIRN_PC_PREFIX "${CAIRN_PC_PREFIX}")
  configure_file("${PROJECT_SOURCE_DIR}/cmake/cairn.pc.in"
    "${PROJECT_BINARY_DIR}/cairn.pc" @ONLY)
  install(FILES "${PROJECT_BINARY_DIR}/cairn.pc" DESTINATION ${pcdir})

  # Binaries.
  foreach(b IN LISTS CAIRN_INSTALL_BINARIES)
    if(NOT TARGET ${b})
      message(FATAL_ERROR "cmake/CairnInstall.cmake: binary ${b} is not a "
        "target (renamed? update CAIRN_INSTALL_BINARIES)")
    endif()
  endforeach()
  install(TARGETS ${CAIRN_INSTALL_BINARIES}
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endfunction()

# The shared libraries an engine links, made of the same objects as tierkv's
# own static libraries:
#   libtierkv (tierkv::client): the worker client that attaches to a
#     tierkvd, the prefix-cache manager and the rest of the engine-side core.
#     No RocksDB.
#   libtierkv_embedded (tierkv::embedded): OpenEmbedded, a store in the
#     engine's process (coordinator, disk tier on RocksDB); links libtierkv.
# Public headers: include/tierkv, included as <tierkv/client.h>.
# 0.x releases may change the ABI with every minor version, so the SONAME
# carries both: libtierkv.so.0.1.
set(TIERKV_SOVERSION "${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}")

add_library(tierkv SHARED)
target_link_libraries(tierkv PRIVATE tierkv_core_objs tierkv_host_objs
  tierkv_client_objs)
add_library(tierkv_embedded SHARED)
target_link_libraries(tierkv_embedded PUBLIC tierkv
  PRIVATE tierkv_coordinator_objs tierkv_disk_objs tierkv_embedded_objs)
foreach(lib tierkv tierkv_embedded)
  target_include_directories(${lib} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  set_target_properties(${lib} PROPERTIES
    VERSION ${PROJECT_VERSION}
    SOVERSION ${TIERKV_SOVERSION})
  # Everything the objects need is inside or linked; no undefined symbol is
  # left for the engine to supply.
  target_link_options(${lib} PRIVATE -Wl,--no-undefined)
endforeach()
# The headers need C++20; CMake consumers get at least that.
target_compile_features(tierkv INTERFACE cxx_std_20)
# libtierkv_embedded finds libtierkv next to itself, wherever installed.
set_target_properties(tierkv_embedded PROPERTIES INSTALL_RPATH "$ORIGIN")
set_target_properties(tierkv PROPERTIES EXPORT_NAME client)
set_target_properties(tierkv_embedded PROPERTIES EXPORT_NAME embedded)

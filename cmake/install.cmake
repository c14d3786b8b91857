# cmake --install: the daemons, the worker client's static libraries and
# public headers, a CMake package (find_package(tierkv)) and tierkv.pc.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS tierkvd tierkv-admin RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS tierkv_core tierkv_tiers tierkv_ipc
  EXPORT tierkvTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tierkv)
foreach(lib tierkv_core tierkv_tiers tierkv_ipc)
  target_include_directories(${lib} INTERFACE
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/tierkv>)
endforeach()

# What an engine includes: the client and the headers it names.
set(TIERKV_PUBLIC_HEADERS
  src/block_key.h src/block_pool.h src/chunk_tier.h src/coordinator.h
  src/free_block_queue.h
  src/kv_cache_manager.h src/kv_layout.h src/lower_tier.h src/request.h
  src/status.h
  tiers/device_tier.h ipc/client.h ipc/chunk_tier.h)
foreach(header ${TIERKV_PUBLIC_HEADERS})
  get_filename_component(dir ${header} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${header}
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tierkv/${dir})
endforeach()

# tierkv::client: everything an engine links, under one name.
add_library(tierkv_client INTERFACE)
target_link_libraries(tierkv_client INTERFACE tierkv_ipc)
set_target_properties(tierkv_client PROPERTIES EXPORT_NAME client)
install(TARGETS tierkv_client EXPORT tierkvTargets)

install(EXPORT tierkvTargets NAMESPACE tierkv::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tierkv)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tierkvConfig.cmake.in
  ${PROJECT_BINARY_DIR}/tierkvConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tierkv)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/tierkvConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/tierkvConfig.cmake
  ${PROJECT_BINARY_DIR}/tierkvConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tierkv)
configure_file(${PROJECT_SOURCE_DIR}/cmake/tierkv.pc.in
  ${PROJECT_BINARY_DIR}/tierkv.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/tierkv.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# systemd: the unit, generated because ExecStart names the installed tierkvd
# and its config by absolute path (this configure's CMAKE_INSTALL_PREFIX; a
# later `cmake --install --prefix` does not change them, DESTDIR staging
# keeps them right); the user it runs as; and the example config, as a
# document, so that a reinstall never overwrites an edited
# /etc/tierkv/tierkvd.conf.
set(TIERKV_SYSTEMD_UNIT_DIR "lib/systemd/system" CACHE STRING
  "Where tierkvd.service is installed, relative to the install prefix")
configure_file(${PROJECT_SOURCE_DIR}/systemd/tierkvd.service.in
  ${PROJECT_BINARY_DIR}/systemd/tierkvd.service @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/systemd/tierkvd.service
  DESTINATION ${TIERKV_SYSTEMD_UNIT_DIR})
install(FILES ${PROJECT_SOURCE_DIR}/systemd/tierkv.sysusers
  DESTINATION lib/sysusers.d RENAME tierkv.conf)
install(FILES ${PROJECT_SOURCE_DIR}/systemd/tierkvd.conf
  DESTINATION ${CMAKE_INSTALL_DOCDIR})

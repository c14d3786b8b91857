# cmake --install: the daemons, the shared libraries engines link
# (cmake/libraries.cmake) and their public headers, a CMake package
# (find_package(tierkv)) and pkg-config files (tierkv, tierkv-embedded).
include(CMakePackageConfigHelpers)

install(TARGETS tierkvd tierkv-admin tierkv-replay RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS tierkv tierkv_embedded
  EXPORT tierkvTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The public headers, and nothing else: the coordinator, block pool, free
# queue, tiers and server stay inside.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tierkv
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

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

# pkg-config: tierkv (the client) and tierkv-embedded. Relocatable: the
# prefix is found from where the .pc file lies, as many levels up as
# <libdir>/pkgconfig is deep (lib/pkgconfig, or Debian's multiarch
# lib/x86_64-linux-gnu/pkgconfig).
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(TIERKV_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(TIERKV_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  file(RELATIVE_PATH TIERKV_PC_UP
    "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
  set(TIERKV_PC_PREFIX "\${pcfiledir}/${TIERKV_PC_UP}")
  set(TIERKV_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
foreach(pc tierkv tierkv-embedded)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${pc}.pc.in
    ${PROJECT_BINARY_DIR}/${pc}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/${pc}.pc
    DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()

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

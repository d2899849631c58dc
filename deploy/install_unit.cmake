# Run by `cmake --install` (deploy/CMakeLists.txt): installs gpucd.service and the template
# gpucd@.service with the paths of
# this installation, read at install time so that `cmake --install --prefix P` gets a unit
# naming P's gpucd and gpucd.conf, and as Type=exec, without WatchdogSec=, for a build without
# libsystemd (which sends systemd no notifications).
# In: GPUCD_UNIT_SOURCES (the units, a list), GPUCD_BINDIR, GPUCD_SYSCONFDIR (as GNUInstallDirs gives them),
# GPUCD_HAVE_SYSTEMD.
foreach(kind BINDIR SYSCONFDIR)
  if(IS_ABSOLUTE "${GPUCD_${kind}}")
    set(${kind} "${GPUCD_${kind}}")
  else()
    set(${kind} "${CMAKE_INSTALL_PREFIX}/${GPUCD_${kind}}")
  endif()
endforeach()
foreach(source IN LISTS GPUCD_UNIT_SOURCES)
  file(READ "${source}" unit)
  string(REPLACE "/usr/local/bin/gpucd" "${BINDIR}/gpucd" unit "${unit}")
  string(REPLACE "/etc/gpucd/gpucd.conf" "${SYSCONFDIR}/gpucd/gpucd.conf" unit "${unit}")
  if(NOT GPUCD_HAVE_SYSTEMD)
    string(REPLACE "\nType=notify\n" "\nType=exec\n" unit "${unit}")
    string(REGEX REPLACE "\nWatchdogSec=[^\n]*" "" unit "${unit}")
  endif()
  get_filename_component(name "${source}" NAME)
  set(dest "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/lib/systemd/system/${name}")
  message(STATUS "Installing: ${dest}")
  file(WRITE "${dest}" "${unit}")
  list(APPEND CMAKE_INSTALL_MANIFEST_FILES "${dest}")
endforeach()

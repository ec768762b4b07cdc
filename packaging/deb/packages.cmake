# Debian packages, one CPack component each (tools/build-debs.sh builds them;
# docs/operating.md, "Packages", says what each holds):
#   ivcuda-host      (component host)   ivcudad, ivcudactl, the systemd unit,
#                                        /etc/ivcuda/ivcudad.toml
#   ivcuda-guest     (component guest)  libcuda.so.1 in a private directory
#                                        that /etc/ld.so.conf.d names, the udev rule
#   ivcuda-uio-dkms  (component dkms)   uio-driver/ as DKMS source (Arch: all)
# Included from the top CMakeLists.txt once every target exists, so that
# ivcudactl is packaged whichever directory defines it.
#
# Paths: CPack installs into the package with the prefix /usr, so relative
# destinations land under /usr and /etc is named absolutely (CPack's DEB
# generator installs through DESTDIR, which keeps absolute paths inside the
# package). Maintainer scripts and control files are packaging/deb/<package>/.

set(_deb ${CMAKE_CURRENT_LIST_DIR})
set(_deb_gen ${PROJECT_BINARY_DIR}/packaging/deb)
# Debian's compilers report their multiarch triplet (x86_64-linux-gnu).
set(_multiarch ${CMAKE_LIBRARY_ARCHITECTURE})
if(NOT _multiarch)
  set(_multiarch x86_64-linux-gnu)
endif()
set(IVCUDA_GUEST_LIBDIR lib/${_multiarch}/ivcuda)
set(IVCUDA_DKMS_NAME ivcuda-uio)
set(IVCUDA_DEB_MAINTAINER "ivcuda maintainers <maintainers@ivcuda.invalid>" CACHE STRING
    "The Maintainer: field of the Debian packages")

# What every package's /usr/share/doc/<package> holds: the licence in Debian's
# format and a changelog (a native package's changelog.gz), dated at
# configure time (SOURCE_DATE_EPOCH fixes it).
string(TIMESTAMP _deb_date "%a, %d %b %Y %H:%M:%S +0000" UTC)
configure_file(${_deb}/changelog.in ${_deb_gen}/changelog @ONLY)
file(ARCHIVE_CREATE OUTPUT ${_deb_gen}/changelog.gz PATHS ${_deb_gen}/changelog
     FORMAT raw COMPRESSION GZip COMPRESSION_LEVEL 9)
foreach(_pkg host guest dkms)
  set(_name ivcuda-${_pkg})
  if(_pkg STREQUAL dkms)
    set(_name ivcuda-uio-dkms)
  endif()
  install(FILES ${_deb}/copyright ${_deb_gen}/changelog.gz DESTINATION share/doc/${_name} COMPONENT ${_pkg})
endforeach()

# What the packages hold, built by one target (tools/build-debs.sh builds it
# before running cpack, which builds nothing itself).
add_custom_target(ivcuda_package_files)

# --- ivcuda-host --------------------------------------------------------------
if(TARGET ivcudad)
  add_dependencies(ivcuda_package_files ivcudad)
  install(TARGETS ivcudad RUNTIME DESTINATION sbin COMPONENT host)
  # ivcudactl talks to a running ivcudad; it may not exist in every checkout yet.
  if(TARGET ivcudactl)
    add_dependencies(ivcuda_package_files ivcudactl)
    install(TARGETS ivcudactl RUNTIME DESTINATION bin COMPONENT host)
  endif()
  install(FILES ${PROJECT_SOURCE_DIR}/packaging/systemd/ivcudad.service
          DESTINATION lib/systemd/system COMPONENT host)
  install(FILES ${PROJECT_SOURCE_DIR}/packaging/ivcudad.toml DESTINATION /etc/ivcuda COMPONENT host)
  # The group of the daemon's sockets (the unit's Group=, socket-group) and
  # the workers' user (ivcudad.toml's user).
  install(FILES ${_deb}/sysusers-ivcuda-host.conf DESTINATION lib/sysusers.d
          RENAME ivcuda-host.conf COMPONENT host)
  # The unit's Documentation= points here.
  install(FILES ${PROJECT_SOURCE_DIR}/docs/operating.md ${PROJECT_SOURCE_DIR}/docs/libvirt.md
                ${PROJECT_SOURCE_DIR}/packaging/libvirt/ivcuda-shmem-doorbell.xml
                ${PROJECT_SOURCE_DIR}/packaging/libvirt/ivcuda-shmem-plain.xml
          DESTINATION share/doc/ivcuda COMPONENT host)
endif()

# --- ivcuda-guest -------------------------------------------------------------
if(TARGET ivcuda_guest)
  add_dependencies(ivcuda_package_files ivcuda_guest)
  # Not in the multiarch directory itself: an NVIDIA driver's libcuda.so.1
  # may live there. The ld.so.conf.d entry puts this directory in ld.so.cache.
  install(TARGETS ivcuda_guest LIBRARY DESTINATION ${IVCUDA_GUEST_LIBDIR} NAMELINK_SKIP COMPONENT guest)
  configure_file(${_deb}/ld.so.conf.in ${_deb_gen}/ivcuda.conf @ONLY)
  install(FILES ${_deb_gen}/ivcuda.conf DESTINATION /etc/ld.so.conf.d COMPONENT guest)
  install(FILES ${PROJECT_SOURCE_DIR}/uio-driver/99-ivcuda.rules DESTINATION lib/udev/rules.d COMPONENT guest)
  install(FILES ${_deb}/sysusers-ivcuda.conf DESTINATION lib/sysusers.d
          RENAME ivcuda-guest.conf COMPONENT guest)
  install(FILES ${_deb}/ivcuda-guest/lintian-overrides DESTINATION share/lintian/overrides
          RENAME ivcuda-guest COMPONENT guest)
  # The guest's NVML next to its libcuda.so.1 (it speaks through it), and ivcuda-smi.
  if(TARGET ivcuda_nvml AND TARGET ivcuda-smi)
    add_dependencies(ivcuda_package_files ivcuda_nvml ivcuda-smi)
    install(TARGETS ivcuda_nvml LIBRARY DESTINATION ${IVCUDA_GUEST_LIBDIR} NAMELINK_SKIP COMPONENT guest)
    install(TARGETS ivcuda-smi RUNTIME DESTINATION bin COMPONENT guest)
  endif()
endif()

# --- ivcuda-uio-dkms ----------------------------------------------------------
set(_dkms_src src/${IVCUDA_DKMS_NAME}-${PROJECT_VERSION})
configure_file(${_deb}/ivcuda-uio-dkms/dkms.conf.in ${_deb_gen}/dkms.conf @ONLY)
foreach(script postinst prerm)
  configure_file(${_deb}/ivcuda-uio-dkms/${script}.in ${_deb_gen}/ivcuda-uio-dkms/${script} @ONLY)
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/uio-driver/ivcuda_uio.c ${PROJECT_SOURCE_DIR}/uio-driver/Kbuild
              ${PROJECT_SOURCE_DIR}/uio-driver/Makefile ${_deb_gen}/dkms.conf
        DESTINATION ${_dkms_src} COMPONENT dkms)

# --- CPack --------------------------------------------------------------------
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ivcuda)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "The ivcuda authors")
set(CPACK_PACKAGE_CONTACT ${IVCUDA_DEB_MAINTAINER})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_COMPONENTS_ALL host guest dkms)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# Maintainer scripts 0755, control files 0644, whatever the checkout's modes.
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_DEBIAN_HOST_PACKAGE_NAME ivcuda-host)
set(CPACK_DEBIAN_HOST_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_HOST_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_HOST_PACKAGE_CONTROL_EXTRA
    ${_deb}/ivcuda-host/conffiles ${_deb}/ivcuda-host/postinst ${_deb}/ivcuda-host/prerm
    ${_deb}/ivcuda-host/postrm)
set(CPACK_COMPONENT_HOST_DESCRIPTION
    "ivcuda host daemon: CUDA for QEMU guests over ivshmem
ivcudad owns the host's NVIDIA GPUs and serves the CUDA Driver API to QEMU
guests (ivshmem-doorbell or ivshmem-plain) and to local processes, each guest
process with a sandboxed worker of its own. Includes ivcudactl, a systemd
unit (not enabled on installation) and /etc/ivcuda/ivcudad.toml.")

set(CPACK_DEBIAN_GUEST_PACKAGE_NAME ivcuda-guest)
set(CPACK_DEBIAN_GUEST_PACKAGE_SHLIBDEPS ON)
# ivcuda-smi needs the package's own libnvidia-ml.so.1, in its private directory
# (relative: dpkg-shlibdeps runs in the package's staging root).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS usr/${IVCUDA_GUEST_LIBDIR})
set(CPACK_DEBIAN_GUEST_PACKAGE_SECTION libs)
# The kernel driver is needed in a VM only; process mode works without it.
set(CPACK_DEBIAN_GUEST_PACKAGE_RECOMMENDS ivcuda-uio-dkms)
# Its ld.so.conf.d entry sorts before the multiarch directory's, so on a GPU
# host its libcuda.so.1 would shadow the driver's - for ivcudad's workers too.
set(CPACK_DEBIAN_GUEST_PACKAGE_CONFLICTS ivcuda-host)
set(CPACK_DEBIAN_GUEST_PACKAGE_CONTROL_EXTRA
    ${_deb}/ivcuda-guest/conffiles ${_deb}/ivcuda-guest/triggers ${_deb}/ivcuda-guest/postinst
    ${_deb}/ivcuda-guest/postrm)
set(CPACK_COMPONENT_GUEST_DESCRIPTION
    "ivcuda guest library: libcuda.so.1 that forwards to ivcudad
A CUDA driver library for QEMU guests (through the ivshmem device and the
ivcuda_uio kernel driver) and for containers (through ivcudad's socket).
Unmodified CUDA programs find it through ld.so.cache
(/etc/ld.so.conf.d/ivcuda.conf). A udev rule gives the device nodes to the
group ivcuda with mode 0660. Not for the GPU host itself: there it would
shadow the NVIDIA driver's libcuda.so.1.")

set(CPACK_DEBIAN_DKMS_PACKAGE_NAME ivcuda-uio-dkms)
set(CPACK_DEBIAN_DKMS_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_DKMS_PACKAGE_SECTION kernel)
set(CPACK_DEBIAN_DKMS_PACKAGE_DEPENDS dkms)
set(CPACK_DEBIAN_DKMS_PACKAGE_CONTROL_EXTRA
    ${_deb_gen}/ivcuda-uio-dkms/postinst ${_deb_gen}/ivcuda-uio-dkms/prerm)
set(CPACK_COMPONENT_DKMS_DESCRIPTION
    "ivcuda guest kernel driver (DKMS source)
ivcuda_uio is the UIO driver for QEMU's ivshmem device that ivcuda's guest
library uses in a VM: one device node per MSI-X vector, and a notice to the
host when a process that used the device exits. DKMS builds it for each
installed kernel.")

include(CPack)

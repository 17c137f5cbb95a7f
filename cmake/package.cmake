# Debian packages of a build: `cpack -G DEB` in the build directory writes
#   dtrain_<version>_<arch>.deb      launch, checkpoint, the shared libraries, the sample trainers
#                                    (<libexec>/dtrain): what every node of a job needs; the
#                                    Prometheus alert rules and the Grafana dashboard
#                                    (/usr/share/dtrain)
#   dtrain-dev_<version>_<arch>.deb  headers and the CMake package (find_package(dtrain)), the
#                                    libraries' .so links: for building programs against dtrain
# The runtime package's dependencies come from dpkg-shlibdeps over its binaries (Gloo, libuv,
# OpenSSL, ... as the build linked them; Debian's libtorch when built against it), so a worker node
# pulls runtime libraries, not -dev packages. Libraries no Debian package owns (a CUDA toolkit's
# NCCL and runtime in /usr/local/cuda; libtorch and NCCL from pip wheels, whose folders the
# binaries' RUNPATH names) are left out of them: such a node has them from NVIDIA or pip, and
# `launch --check` names a node on which a library does not resolve. The -dev package depends on
# the runtime package of the same version and on the -dev packages its CMake package and headers
# need (find_dependency(fmt), and Torch when the libtorch layer is built): that short list is by
# hand, as dpkg-shlibdeps sees only binaries. tests/scripts/deb_package_test.sh checks both.
set(CPACK_PACKAGE_NAME dtrain)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "distributed training for libtorch (C++) programs: the launch launcher and libdtrain")
set(CPACK_PACKAGE_CONTACT "dtrain developers <dtrain@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_COMPONENTS_ALL runtime dev)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME dtrain)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)
# NCCL and libtorch from pip wheels (.venv, cmake/dependencies.cmake) are found by dpkg-shlibdeps
# only when told where: no package owns them, so they add no dependency, as a toolkit's NCCL did.
set(_private_dirs ${DTRAIN_WHEEL_LIBRARY_DIRS})
if(DTRAIN_HAVE_NCCL AND NCCL_LIBRARY)
  get_filename_component(_nccl_dir "${NCCL_LIBRARY}" DIRECTORY)
  list(APPEND _private_dirs "${_nccl_dir}")
endif()
if(_private_dirs)
  list(REMOVE_DUPLICATES _private_dirs)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS "${_private_dirs}")
endif()
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION
    "launch (a torchrun-style launcher), the checkpoint tool, the libraries\nlibdtrain_base, libdtrain_comm and libdtrain, and the sample trainers\ntrain_linear and train_resnet in /usr/libexec/dtrain: what every node of a\njob needs. Also the Prometheus alert rules and the Grafana dashboard in\n/usr/share/dtrain.")
set(CPACK_DEBIAN_DEV_PACKAGE_NAME dtrain-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_SHLIBDEPS OFF)
set(_dev_depends "dtrain (= ${PROJECT_VERSION}), libfmt-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${_dev_depends}")
set(CPACK_DEBIAN_DEV_DESCRIPTION
    "Development files: the headers and the CMake package (find_package(dtrain), then\nlink dtrain::dtrain).")
include(CPack)

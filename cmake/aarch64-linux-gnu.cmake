# Cross-compiling for aarch64 Linux with Debian's g++-aarch64-linux-gnu and
# the arm64 multiarch -dev packages (libhwy-dev:arm64, libgtest-dev:arm64),
# whose libraries live in /usr/lib/aarch64-linux-gnu; what is built runs
# under qemu-user (`make test-arm`, scripts/test_arm.sh).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# The target's C library and loader (libc6-arm64-cross): where qemu finds them.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static -L /usr/aarch64-linux-gnu)
# Libraries and packages for the target only; programs (pkg-config, cmake
# helpers) from the host.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

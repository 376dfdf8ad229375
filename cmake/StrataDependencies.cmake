# Finds strata's dependencies. Everything comes from Debian packages except CUDA and NCCL, which
# live in /usr/local/cuda. Each find says which package provides it, so a failure names the fix.

find_package(MPI 3.1 REQUIRED COMPONENTS C CXX)        # openmpi-bin libopenmpi-dev
find_package(nlohmann_json 3 REQUIRED CONFIG)          # nlohmann-json3-dev
find_package(CLI11 2 REQUIRED CONFIG)                  # libcli11-dev
find_package(Threads REQUIRED)

# Parallel HDF5 (libhdf5-openmpi-dev). Only the C component: Debian ships no parallel C++ wrapper
# script, so find_package(HDF5 COMPONENTS CXX) fails for this flavour.
set(HDF5_PREFER_PARALLEL TRUE)
find_package(HDF5 REQUIRED COMPONENTS C)
if(NOT HDF5_IS_PARALLEL)
  message(FATAL_ERROR "strata needs parallel HDF5: install libhdf5-openmpi-dev (found a serial HDF5)")
endif()
set(STRATA_HDF5_ENABLED ${HDF5_FOUND})

find_package(ZLIB REQUIRED)                            # zlib1g-dev: gzip'd IDX files
find_package(OpenSSL 1.1 REQUIRED COMPONENTS Crypto)   # libssl-dev: HMAC-SHA256 of the data plane's handshake
find_package(Eigen3 3.3 REQUIRED CONFIG)               # libeigen3-dev

# A serial BLAS flavour from Debian's per-flavour directories (/usr/lib/<arch>/<dir>,
# /usr/include/<arch>/<dir>): sets <prefix>_LIBRARY and <prefix>_INCLUDE_DIR (cache) and
# <prefix>_ENABLED; with the option OFF it is not looked for, with ON a missing one is fatal.
function(strata_find_serial_blas prefix option library header dir package what fallback)
  set(${prefix}_ENABLED 0 PARENT_SCOPE)
  if(${option} STREQUAL "OFF")
    return()
  endif()
  find_library(${prefix}_LIBRARY NAMES ${library} PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/${dir} NO_DEFAULT_PATH)
  find_path(${prefix}_INCLUDE_DIR ${header} PATHS /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/${dir} NO_DEFAULT_PATH)
  if(${prefix}_LIBRARY AND ${prefix}_INCLUDE_DIR)
    set(${prefix}_ENABLED 1 PARENT_SCOPE)
  elseif(${option} STREQUAL "ON")
    message(FATAL_ERROR "${option}=ON but ${what} was not found (install ${package})")
  else()
    message(STATUS "${what} not found: ${fallback} (install ${package})")
  endif()
endfunction()

# OpenBLAS, serial flavour (libopenblas-serial-dev): optional, the models' matrix products
# (src/model/gemm.h; Eigen otherwise). The serial build never starts threads of its own: a step runs
# on its replica's thread. Its cpuid-chosen kernels are checked at run time before use.
strata_find_serial_blas(STRATA_OPENBLAS STRATA_WITH_OPENBLAS openblas cblas.h openblas-serial libopenblas-serial-dev
                        "the serial OpenBLAS" "the models' products use Eigen")

# BLIS, serial flavour (libblis-serial-dev): optional, the default for the models' matrix products
# when found (src/model/gemm.h). Reentrant by design (its buffer pools are locked), starts no
# threads, picks its kernels by cpuid at run time, and is called through its native bli_sgemm (no
# clash with OpenBLAS's BLAS symbols: both libraries export cblas_sgemm, so OpenBLAS is linked
# first and gemm.cc checks where that symbol resolved). Its kernels are checked at run time too.
strata_find_serial_blas(STRATA_BLIS STRATA_WITH_BLIS blis blis.h blis-serial libblis-serial-dev
                        "the serial BLIS" "the models' products use Eigen by default")

# UCX (libucx-dev): optional, one transport among two.
set(STRATA_UCX_ENABLED 0)
if(STRATA_WITH_UCX)
  find_package(ucx CONFIG)
  if(ucx_FOUND)
    set(STRATA_UCX_ENABLED 1)
  else()
    message(WARNING "STRATA_WITH_UCX is ON but UCX was not found (install libucx-dev); building without it")
  endif()
endif()

# CUDA and NCCL: AUTO builds the GPU parts whenever nvcc is present, even without a GPU, so the GPU
# code always compiles in CI.
set(STRATA_CUDA_ENABLED 0)
set(STRATA_NCCL_ENABLED 0)
if(NOT STRATA_WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  find_package(CUDAToolkit QUIET)
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
    set(STRATA_CUDA_ENABLED 1)
  elseif(STRATA_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "STRATA_WITH_CUDA=ON but no CUDA compiler/toolkit was found")
  endif()
endif()
if(NOT STRATA_WITH_NCCL STREQUAL "OFF")
  if(NOT STRATA_CUDA_ENABLED)
    if(STRATA_WITH_NCCL STREQUAL "ON")
      message(FATAL_ERROR "STRATA_WITH_NCCL=ON needs CUDA (STRATA_WITH_CUDA)")
    endif()
  else()
    find_library(STRATA_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib /usr/local/cuda/lib64)
    find_path(STRATA_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
    if(STRATA_NCCL_LIBRARY AND STRATA_NCCL_INCLUDE_DIR)
      set(STRATA_NCCL_ENABLED 1)
    elseif(STRATA_WITH_NCCL STREQUAL "ON")
      message(FATAL_ERROR "STRATA_WITH_NCCL=ON but nccl.h / libnccl were not found")
    endif()
  endif()
endif()

# Warnings for our own targets only (target-scoped, never CMAKE_CXX_FLAGS).
add_library(strata_warnings INTERFACE)
target_compile_options(strata_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wundef -Wno-unused-parameter>)

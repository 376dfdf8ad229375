# Code generation for strata's own code: which instruction set, and the floating-point rules that
# keep results bit-reproducible whatever that instruction set is.
#
# STRATA_ARCH
#   native    (default) -march=native: the build machine's vector units (AVX2/FMA/AVX-512 where it
#             has them). Eigen's matrix products, which are most of a training step, are 2-3x faster
#             than on the x86-64 baseline. The binaries may not run on an older CPU.
#   portable  the compiler's generic target (x86-64 on amd64): for packages, container images and
#             clusters whose nodes are not all the build machine's model.
#   <other>   passed as -march=<other>, e.g. x86-64-v3 (Haswell and later: AVX2 + FMA) for a
#             package that still runs on every node of a known cluster.
#
# Whatever the choice, every C/C++ file we build (libraries, the strata tool, the tests and their
# scalar references, the in-tree examples) gets -ffp-contract=off: the compiler never fuses a*b + c
# into an FMA on its own. GCC contracts by default whenever the target has FMA, and does it
# differently in a scalar loop and in vectorised code, so the optimizer's Eigen path and its
# scalar reference, a shard split at different elements, or a PS sum and a test's sum would
# disagree in the last bit. Explicit FMAs stay: Eigen's GEMM kernels call them as intrinsics, which
# is where the speed is, and a product's summation order is fixed for a given build (the same
# binary on every rank gives the same bits; include/strata/ps/optimizer.h has the full contract).
#
# STRATA_TUNE (instruction scheduling only; it never changes a result bit)
#   auto      (default) the compiler's choice, except where -march=native names a CPU model that
#             lacks the build machine's AVX-512 (GCC 12 takes a Zen 4 for a Zen 3, znver3): that
#             model's scheduling is then for another CPU, and -mtune=generic is used instead. On
#             an AMD EPYC (Zen 4) VM Eigen's products of the MLP's step ran 1.31x faster with
#             generic scheduling, with the same bits (docs/PERFORMANCE.md).
#   <other>   passed as -mtune=<other> (e.g. generic, native, znver4).
#
# The flags are a build-tree usage requirement of every strata layer ($<BUILD_INTERFACE:...>), so
# anything in this tree that links a layer compiles the same way, and the installed package hands
# nothing to its users: a consumer chooses its own -march. The choice is recorded in config.h
# (STRATA_BUILD_ARCH) and in the package config (strata_ARCH).
include(CheckCXXCompilerFlag)
include(CheckCXXSourceCompiles)

set(STRATA_ARCH "native" CACHE STRING
    "Instruction set of strata's code: native (-march=native, default), portable (the compiler's generic target), or a -march value")
set_property(CACHE STRATA_ARCH PROPERTY STRINGS native portable x86-64-v2 x86-64-v3 x86-64-v4)
set(STRATA_TUNE "auto" CACHE STRING
    "Instruction scheduling of strata's code: auto (the compiler's, or generic where -march=native names a CPU model without this machine's AVX-512) or a -mtune value")

add_library(strata_codegen INTERFACE)
target_compile_options(strata_codegen INTERFACE $<$<COMPILE_LANGUAGE:C,CXX>:-ffp-contract=off>)
# optimizer.cc refuses to compile for an FMA target unless this says contraction is off.
target_compile_definitions(strata_codegen INTERFACE $<$<COMPILE_LANGUAGE:C,CXX>:STRATA_FP_CONTRACT_OFF>)

if(STRATA_ARCH STREQUAL "portable")
  set(strata_march "")
elseif(STRATA_ARCH STREQUAL "")
  message(FATAL_ERROR "STRATA_ARCH is empty: use native, portable or a -march value")
else()
  set(strata_march "-march=${STRATA_ARCH}")
  # A typo (or an -march this compiler does not know) fails here, once, not in every file.
  set(CMAKE_REQUIRED_QUIET ON)
  check_cxx_compiler_flag("${strata_march}" STRATA_MARCH_OK_${STRATA_ARCH})
  unset(CMAKE_REQUIRED_QUIET)
  if(NOT STRATA_MARCH_OK_${STRATA_ARCH})
    message(FATAL_ERROR "STRATA_ARCH=${STRATA_ARCH}: ${CMAKE_CXX_COMPILER_ID} does not accept ${strata_march} "
                        "(use native, portable or a -march value it knows)")
  endif()
  # C and C++ only: nvcc does not take -march, and CUDA host code does no training arithmetic.
  target_compile_options(strata_codegen INTERFACE $<$<COMPILE_LANGUAGE:C,CXX>:${strata_march}>)
  # GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves (__Y = __Y), and
  # once Eigen's AVX-512 packets are inlined into our code GCC warns about that in every file using
  # Eigen (-W(maybe-)uninitialized; GCC bug 105593, fixed in 13). Only then are those two off.
  set(CMAKE_REQUIRED_FLAGS "${strata_march}")
  set(CMAKE_REQUIRED_QUIET ON)
  check_cxx_source_compiles("#ifndef __AVX512F__\n#error no AVX-512\n#endif\nint main() { return 0; }"
                            STRATA_ARCH_HAS_AVX512_${STRATA_ARCH})
  unset(CMAKE_REQUIRED_FLAGS)
  unset(CMAKE_REQUIRED_QUIET)
  if(STRATA_ARCH_HAS_AVX512_${STRATA_ARCH} AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU"
     AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(strata_codegen INTERFACE
      $<$<COMPILE_LANGUAGE:CXX>:-Wno-uninitialized -Wno-maybe-uninitialized>)
  endif()
endif()

# Scheduling (STRATA_TUNE, above).
set(strata_mtune "")
if(NOT STRATA_TUNE STREQUAL "auto")
  set(strata_mtune "-mtune=${STRATA_TUNE}")
  set(CMAKE_REQUIRED_QUIET ON)
  check_cxx_compiler_flag("${strata_mtune}" STRATA_MTUNE_OK_${STRATA_TUNE})
  unset(CMAKE_REQUIRED_QUIET)
  if(NOT STRATA_MTUNE_OK_${STRATA_TUNE})
    message(FATAL_ERROR "STRATA_TUNE=${STRATA_TUNE}: ${CMAKE_CXX_COMPILER_ID} does not accept ${strata_mtune}")
  endif()
elseif(STRATA_ARCH STREQUAL "native" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND STRATA_ARCH_HAS_AVX512_native)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -march=native -Q --help=target
                  OUTPUT_VARIABLE strata_native_target ERROR_QUIET RESULT_VARIABLE strata_native_rc)
  if(strata_native_rc EQUAL 0 AND strata_native_target MATCHES "-mtune=[ \t]*(znver[123])[ \t\r\n]")
    set(strata_mtune "-mtune=generic")
    message(STATUS "strata: -march=native is ${CMAKE_MATCH_1}, a model without this CPU's AVX-512: "
                   "scheduling with -mtune=generic (STRATA_TUNE overrides)")
  endif()
endif()
if(strata_mtune)
  target_compile_options(strata_codegen INTERFACE $<$<COMPILE_LANGUAGE:C,CXX>:${strata_mtune}>)
endif()

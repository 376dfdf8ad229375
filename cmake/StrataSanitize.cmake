# STRATA_SANITIZE: build everything in this tree with the compiler's sanitizers, e.g.
#   -DSTRATA_SANITIZE=address,undefined
# Every C and C++ file strata compiles (libraries, the strata tool, tests, examples) and every link
# gets -fsanitize=<list> -fno-omit-frame-pointer, and -fno-sanitize-recover=undefined when the list
# has `undefined`, so the first undefined-behaviour report ends the process (non-zero status) like
# an AddressSanitizer report does instead of scrolling past in a passing test's output.
#
# Directory-scoped on purpose (add_compile_options/add_link_options here, at the top, before any
# target): a sanitizer build must cover every object of the process, including the test binaries
# and their helpers, and a usage requirement carried by the strata layers would miss targets that do
# not link one. Nothing is exported: the installed package never hands these flags to a consumer.
# CUDA sources (nvcc takes no -fsanitize) are left alone; the sanitize tier builds without CUDA.
#
# The `sanitize` test (tests/sanitize/sanitize_tier.sh) configures a second tree with this option and
# runs the unit and mpi tiers there; tests/sanitize/sanitize_tier.sh says how to run it by hand.
set(STRATA_SANITIZE "" CACHE STRING
    "Sanitizers for every target, comma-separated, e.g. address,undefined (empty: none)")

if(STRATA_SANITIZE)
  string(REPLACE "," ";" strata_sanitizers "${STRATA_SANITIZE}")
  foreach(s IN LISTS strata_sanitizers)
    if(NOT s MATCHES "^(address|undefined|leak|thread)$")
      message(FATAL_ERROR "STRATA_SANITIZE=${STRATA_SANITIZE}: '${s}' is not one of address, undefined, leak, thread")
    endif()
  endforeach()
  if("thread" IN_LIST strata_sanitizers AND ("address" IN_LIST strata_sanitizers OR "leak" IN_LIST strata_sanitizers))
    message(FATAL_ERROR "STRATA_SANITIZE=${STRATA_SANITIZE}: thread cannot be combined with address or leak")
  endif()
  string(REPLACE ";" "," strata_sanitize_list "${strata_sanitizers}")
  set(strata_sanitize_flags -fsanitize=${strata_sanitize_list} -fno-omit-frame-pointer)
  if("undefined" IN_LIST strata_sanitizers)
    list(APPEND strata_sanitize_flags -fno-sanitize-recover=undefined)
  endif()
  include(CheckCXXSourceCompiles)
  set(CMAKE_REQUIRED_FLAGS "-fsanitize=${strata_sanitize_list}")
  set(CMAKE_REQUIRED_LINK_OPTIONS "-fsanitize=${strata_sanitize_list}")
  set(CMAKE_REQUIRED_QUIET ON)
  check_cxx_source_compiles("int main() { return 0; }" STRATA_SANITIZE_WORKS_${strata_sanitize_list})
  unset(CMAKE_REQUIRED_FLAGS)
  unset(CMAKE_REQUIRED_LINK_OPTIONS)
  unset(CMAKE_REQUIRED_QUIET)
  if(NOT STRATA_SANITIZE_WORKS_${strata_sanitize_list})
    message(FATAL_ERROR "STRATA_SANITIZE=${STRATA_SANITIZE}: ${CMAKE_CXX_COMPILER_ID} cannot build and link with "
                        "-fsanitize=${strata_sanitize_list} (is the sanitizer runtime, e.g. libasan, installed?)")
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${strata_sanitize_flags}>")
  add_link_options("$<$<LINK_LANGUAGE:C,CXX>:-fsanitize=${strata_sanitize_list}>")
endif()

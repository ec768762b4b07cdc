cmake_minimum_required(VERSION 3.25)
# Fails when the GPU test double exports a defined dynamic symbol that is not a driver
# API name (cu*), or lacks a few the forwarding path depends on.
execute_process(COMMAND ${NM} -D --defined-only ${LIB}
  OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm failed on ${LIB}")
endif()
string(REPLACE "\n" ";" lines "${out}")
set(names "")
foreach(line IN LISTS lines)
  if(line MATCHES "^[0-9a-fA-F]* +[A-Za-z] +([^ ]+)$")
    set(name ${CMAKE_MATCH_1})
    list(APPEND names ${name})
    if(NOT name MATCHES "^cu")
      message(FATAL_ERROR "unexpected export from the GPU test double: ${name}")
    endif()
  endif()
endforeach()
foreach(required cuInit cuMemAlloc_v2 cuCtxCreate_v4 cuMemcpyHtoD_v2 cuLaunchKernel
                 cuModuleGetGlobal_v2 cuEventElapsedTime_v2 cuDevicePrimaryCtxRelease_v2
                 cuGreenCtxCreate cuCtxFromGreenCtx cuStreamGetCtx_v2)
  if(NOT required IN_LIST names)
    message(FATAL_ERROR "the GPU test double does not export ${required}")
  endif()
endforeach()
list(LENGTH names n)
message(STATUS "${n} exports, all cu*")

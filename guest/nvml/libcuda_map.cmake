# libcuda.so.1's version script: the generated one (exactly the driver API,
# guest/api) plus the one private entry point the guest's libnvidia-ml.so.1
# calls (guest/nvml/query.h). tests/api/check_exports.py allows exactly that
# name beyond the table, by name.
#   cmake -DIN=cuda_exports.map -DOUT=libcuda_exports.map -P libcuda_map.cmake
file(READ ${IN} map)
string(REPLACE "  global:\n"
  "  global:\n    /* private: ivcuda's libnvidia-ml.so.1 -> this library's transport (guest/nvml/query.h) */\n    ivcuda_nvml_query_v1;\n"
  out "${map}")
if(out STREQUAL map)
  message(FATAL_ERROR "libcuda_map.cmake: no 'global:' line in ${IN}")
endif()
if(EXISTS ${OUT})
  file(READ ${OUT} old)
  if(old STREQUAL out)
    return()
  endif()
endif()
file(WRITE ${OUT} "${out}")

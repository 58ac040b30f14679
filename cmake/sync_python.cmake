cmake_minimum_required(VERSION 3.24)  # IN_LIST (policy CMP0057) in script mode
# Mirrors the Python package's sources (python/fusedattn, subpackages included) into the build
# tree's package folder, and removes .py files there that the source no longer has, so a module that
# moved (fusedattn/torch.py into fusedattn/torch/) leaves nothing stale to import. The compiled
# modules that the build writes into the same folder are not .py files and stay.
# Run as: cmake -DSOURCE=<python/fusedattn> -DDEST=<build/python/fusedattn> -P sync_python.cmake
file(GLOB_RECURSE _sources RELATIVE "${SOURCE}" "${SOURCE}/*.py")
file(GLOB_RECURSE _present RELATIVE "${DEST}" "${DEST}/*.py")
foreach(_file ${_present})
  if(NOT _file IN_LIST _sources)
    file(REMOVE "${DEST}/${_file}")
  endif()
endforeach()
foreach(_file ${_sources})
  configure_file("${SOURCE}/${_file}" "${DEST}/${_file}" COPYONLY)
endforeach()

# tf_write_if_changed(<path> <content>): writes the file only when its content
# differs, so generated sources do not trigger needless rebuilds.
function(tf_write_if_changed path content)
  if(EXISTS ${path})
    file(READ ${path} old)
    if(old STREQUAL content)
      return()
    endif()
  endif()
  file(WRITE ${path} "${content}")
endfunction()

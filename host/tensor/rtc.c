/* The run-time compiler's registration (rtc.h): the CUDA backend's, where the build has one. */
#include "rtc.h"

static const tf_rtc_api *tf_rtc_registered;

void tf_rtc_register(const tf_rtc_api *api) { tf_rtc_registered = api; }

const tf_rtc_api *tf_rtc(void) { return tf_rtc_registered; }

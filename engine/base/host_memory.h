// The host's memory as the kernel reports it: what could be handed out now without swapping.
#pragma once

#include <cstddef>

namespace kvpr {

// MemAvailable of /proc/meminfo, or SIZE_MAX where it cannot be read. Pinned memory must all be
// resident, so this bounds it.
size_t host_bytes_available();

}  // namespace kvpr

// Catch2 for a test file that uses LibTorch: include this, not
// <catch2/catch.hpp>. Debian's LibTorch pulls in glog, whose CHECK would
// replace Catch's; LibTorch comes first and glog's CHECK goes, once (a
// unity build puts several test files in one translation unit, and a
// second #undef would take Catch's CHECK away).
#pragma once

#include <torch/torch.h>
#ifndef TWOBLUECUBES_SINGLE_INCLUDE_CATCH_HPP_INCLUDED
#undef CHECK
#endif
#include <catch2/catch.hpp>

// Precompiled header shared by every target. LibTorch's headers dominate compile time, so the
// heavy, stable ones live here; each source file still includes what it uses.
#pragma once
#include <torch/torch.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

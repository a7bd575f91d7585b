// The server's built-in defaults for the per-model settings, defined once: in
// the JSON Schema of model_config.json (components/ml/serving/model_config/
// model_config.schema.json), from which CMake generates model_config_defaults.h (kDefault<Key>, kMin<Key>,
// k<Key>Values). ServerConfig (flags), BatcherOptions, BackendOptions and
// ModelIO all start from these. A model's model_config.json, then SERVING_*
// environment variables, then flags override them.
#pragma once

#include "model_config_defaults.h"

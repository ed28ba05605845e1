"""flatc-generated accessors for tflgpu/cache/schema/cache.fbs (regenerate with its regen.sh)."""

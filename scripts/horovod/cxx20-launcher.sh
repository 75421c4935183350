#!/usr/bin/env bash
# Compiler launcher for the Horovod build: torch >= 2.14 headers require C++20, Horovod asks for C++14.
args=()
for a in "$@"; do
  if [ "$a" = "-std=gnu++14" ] || [ "$a" = "-std=c++14" ]; then args+=("-std=gnu++20"); else args+=("$a"); fi
done
exec "${args[@]}"

#!/usr/bin/env bash
# Installs Debian's chromium package when it is missing (sourced by the headless-browser checks).
if ! command -v chromium >/dev/null; then
  echo "installing Debian's chromium package"
  apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }
fi

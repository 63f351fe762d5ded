//! Fixed prompt texts of the DeepSeek-V4 and V4.1 chat formats. These are part of the model's trained
//! input format, so they must match the reference encoder byte for byte (the rendering fixtures
//! in `tests/fixtures/chat_cases.json` check that); they are not prose to edit.

/// The "## Tools" system-prompt section, the same text in both families but for the tag names.
/// Placeholders: `{dsml}` (the `｜DSML｜` token), `{block}`, `{invoke}`, `{parameter}` (the
/// family's tag names), `{think_start}`, `{think_end}`, and `{tool_schemas}` (one JSON object
/// per line).
pub(crate) const TOOLS_TEMPLATE: &str = concat!(
    "## Tools\n",
    "\n",
    "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<{dsml}{block}>\" block like the following:\n",
    "\n",
    "<{dsml}{block}>\n",
    "<{dsml}{invoke} name=\"$TOOL_NAME\">\n",
    "<{dsml}{parameter} name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{dsml}{parameter}>\n",
    "...\n",
    "</{dsml}{invoke}>\n",
    "<{dsml}{invoke} name=\"$TOOL_NAME2\">\n",
    "...\n",
    "</{dsml}{invoke}>\n",
    "</{dsml}{block}>\n",
    "\n",
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n",
    "\n",
    "If thinking_mode is enabled (triggered by {think_start}), you MUST output your complete reasoning inside {think_start}...{think_end} BEFORE any tool calls or final response.\n",
    "\n",
    "Otherwise, output directly after {think_end} with tool calls or final response.\n",
    "\n",
    "### Available Tool Schemas\n",
    "\n",
    "{tool_schemas}\n",
    "\n",
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n",
);

/// Preamble before the first message in thinking mode with effort "high" (the default when a
/// request enables thinking without naming an effort).
pub(crate) const EFFORT_HIGH: &str = concat!(
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n",
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n",
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n",
    "\n",
);

/// Preamble before the first message in thinking mode with effort "max".
pub(crate) const EFFORT_MAX: &str = concat!(
    "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n",
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively decompose the problem into its most fundamental components, trace every causal chain to its root, and resolve the underlying cause rather than any surface symptom.\n",
    "Do not stop reasoning until you have independently verified the solution from multiple angles and are certain that no assumption remains unchecked and no error remains undiscovered.\n",
    "\n",
);

/// V4.1's effort preamble (thinking mode, first message only, after `<｜System｜>`); `{budget}`
/// is the level, 1–100 (vLLM's `deepseek_v41_encoding.py` `REASONING_EFFORT_TEMPLATE`).
pub(crate) const V41_EFFORT_TEMPLATE: &str =
    "Reasoning Effort: {budget} (range 1-100, the higher the value, the more thorough the reasoning)\n\n";

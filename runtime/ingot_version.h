/* ingot_version.h - the generator version this runtime speaks.
 *
 * Generated model_config.h files carry the version of the generator that wrote them and refuse to
 * compile when it differs from this one (codegen/render.py GENERATOR_VERSION; a test keeps the two
 * equal). Bump both when the contract between generated and hand-written code changes. */
#ifndef INGOT_VERSION_H
#define INGOT_VERSION_H

#define INGOT_GENERATOR_VERSION 2

#endif

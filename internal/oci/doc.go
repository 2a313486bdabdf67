// Package oci is the registry plumbing image import and stage transfer
// share: credentials from a Docker configuration directory, the options
// every registry call takes, a digest-checking reader, transfer progress,
// and the classification of what a registry answers into errdefs classes.
//
// It reads no environment: the front ends resolve the Docker
// configuration directory (DOCKER_CONFIG, else ~/.docker) and pass it in.
package oci

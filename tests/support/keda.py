"""JSON Schemas of the KEDA resources deploy/kubernetes/ uses, written from KEDA's
documented spec (keda.sh/docs: "ScaledObject specification", "Authentication" and the
Redis Lists and RabbitMQ Queue scalers), for the fields toolfleet's manifests set.

Strict like ``kubectl apply --validate=strict``: every mapping refuses a key it does not
know, so a misspelt field (``minReplicas`` for ``minReplicaCount``) fails the test
instead of being ignored by the cluster. KEDA's metadata values are strings.
"""

from __future__ import annotations

from typing import Any

STRING = {"type": "string", "minLength": 1}
NUMBER_TEXT = {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"}
BOOL_TEXT = {"type": "string", "enum": ["true", "false"]}
NAME = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 253}

METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": NAME,
        "namespace": NAME,
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}

REDIS_METADATA = {
    "type": "object",
    "required": ["listName", "listLength"],
    "oneOf": [
        {"required": ["address"]},
        {"required": ["addressFromEnv"]},
        {"required": ["host", "port"]},
    ],
    "properties": {
        "address": {"type": "string", "pattern": r"^[^:/\s]+:[0-9]+$"},
        "addressFromEnv": STRING,
        "host": STRING,
        "port": NUMBER_TEXT,
        "usernameFromEnv": STRING,
        "passwordFromEnv": STRING,
        "listName": STRING,
        "listLength": NUMBER_TEXT,
        "activationListLength": NUMBER_TEXT,
        "databaseIndex": NUMBER_TEXT,
        "enableTLS": BOOL_TEXT,
        "unsafeSsl": BOOL_TEXT,
    },
    "additionalProperties": False,
}

RABBITMQ_METADATA = {
    "type": "object",
    "required": ["queueName", "mode", "value"],
    "properties": {
        "host": STRING,
        "hostFromEnv": STRING,
        "protocol": {"type": "string", "enum": ["auto", "http", "amqp"]},
        "queueName": STRING,
        "mode": {"type": "string", "enum": ["QueueLength", "MessageRate"]},
        "value": NUMBER_TEXT,
        "activationValue": NUMBER_TEXT,
        "vhostName": STRING,
        "useRegex": BOOL_TEXT,
        "excludeUnacknowledged": BOOL_TEXT,
        "unsafeSsl": BOOL_TEXT,
        "timeout": NUMBER_TEXT,
    },
    "additionalProperties": False,
}

AUTH_REF = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": NAME, "kind": {"enum": ["TriggerAuthentication"]}},
    "additionalProperties": False,
}


def _trigger(kind: str, metadata: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["type", "metadata"],
        "properties": {
            "type": {"const": kind},
            "name": STRING,
            "metadata": metadata,
            "authenticationRef": AUTH_REF,
            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
            "useCachedMetrics": {"type": "boolean"},
        },
        "additionalProperties": False,
    }


SCALING_POLICY = {
    "type": "object",
    "required": ["type", "value", "periodSeconds"],
    "properties": {
        "type": {"enum": ["Pods", "Percent"]},
        "value": {"type": "integer", "minimum": 1},
        "periodSeconds": {"type": "integer", "minimum": 1, "maximum": 1800},
    },
    "additionalProperties": False,
}

SCALING_RULES = {
    "type": "object",
    "properties": {
        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "policies": {"type": "array", "items": SCALING_POLICY},
    },
    "additionalProperties": False,
}

SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": NAME,
                        "kind": STRING,
                        "apiVersion": STRING,
                        "envSourceContainerName": STRING,
                    },
                    "additionalProperties": False,
                },
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "idleReplicaCount": {"type": "integer", "minimum": 0},
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "fallback": {
                    "type": "object",
                    "required": ["failureThreshold", "replicas"],
                    "properties": {
                        "failureThreshold": {"type": "integer", "minimum": 0},
                        "replicas": {"type": "integer", "minimum": 0},
                    },
                    "additionalProperties": False,
                },
                "advanced": {
                    "type": "object",
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "properties": {
                                "name": STRING,
                                "behavior": {
                                    "type": "object",
                                    "properties": {
                                        "scaleUp": SCALING_RULES,
                                        "scaleDown": SCALING_RULES,
                                    },
                                    "additionalProperties": False,
                                },
                            },
                            "additionalProperties": False,
                        },
                    },
                    "additionalProperties": False,
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "oneOf": [
                            _trigger("redis", REDIS_METADATA),
                            _trigger("rabbitmq", RABBITMQ_METADATA),
                        ]
                    },
                },
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}

TRIGGER_AUTHENTICATION = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "TriggerAuthentication"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "properties": {
                "secretTargetRef": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["parameter", "name", "key"],
                        "properties": {"parameter": STRING, "name": NAME, "key": STRING},
                        "additionalProperties": False,
                    },
                },
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}

SCHEMAS = {"ScaledObject": SCALED_OBJECT, "TriggerAuthentication": TRIGGER_AUTHENTICATION}
"""Schema by kind (apiVersion keda.sh/v1alpha1)."""

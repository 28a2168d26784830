"""The DDPJob API's group, version and names: what the CRD registers and every manifest names."""

GROUP = "elastic.ddp.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DDPJob"
PLURAL = "ddpjobs"
SINGULAR = "ddpjob"
SHORT_NAMES = ["ddpj"]

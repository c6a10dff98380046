"""The kopf operator: thin handlers around mpjob.planning (decisions) and mpjob.builders."""

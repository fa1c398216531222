provider bench {
	probe get(void *obj);
	probe put(void *obj);
};
